#!/usr/bin/python3
"""PyTorch interop, both ways, with Debian's python3-torch and python3-torchvision.

For resnet18, resnet50 and mobilenet_v2: torchvision's model, trained a few steps (so its
batch norms' running statistics are not their initial ones) and saved with torch.save,
turned into safetensors by tools/torch-to-safetensors, loaded by egeria through
--init-from's code: its eval-mode outputs on the same inputs match PyTorch's. The other
way: egeria's model, trained a few steps, written in torchvision's names, converted to
.pth by the same tool, taken by load_state_dict(strict=True): outputs match again. Then
`egeria export` of a run, and the errors a user meets with the wrong file.

  test_torchvision_interop.py INTEROP_CHECK EGERIA_CLI
"""
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "torch-to-safetensors")
MODELS = [("resnet18", "resnet18"), ("resnet50", "resnet50"), ("mobilenet_v2", "mobilenetv2")]
CLASSES, SIZE, TOLERANCE = 7, 96, 1e-4  # 96 px: torchvision's stems (egeria's for images over 64 px)


def tool_module():
    loader = importlib.machinery.SourceFileLoader("torch_to_safetensors", TOOL)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m


st = tool_module()
failures, passes = [], []


def check(ok, what):
    print(("ok     " if ok else "FAILED ") + what, flush=True)
    (passes if ok else failures).append(what)


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        raise SystemExit("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p


def relative_error(a, b):
    return float((a - b).abs().max() / b.abs().max())


def trained_torchvision(name, seed):
    torch.manual_seed(seed)
    m = getattr(torchvision.models, name)(num_classes=CLASSES)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    m.train()
    for step in range(3):
        x = torch.randn(4, 3, SIZE, SIZE)
        loss = torch.nn.functional.cross_entropy(m(x), torch.arange(4) % CLASSES)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


def main():
    interop, cli = sys.argv[1], sys.argv[2]
    d = tempfile.mkdtemp(prefix="eg_interop_")
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        x = torch.randn(3, 3, SIZE, SIZE)
        inputs = os.path.join(d, "x.safetensors")
        st.save_safetensors({"x": x}, inputs)
        for tv_name, eg_name in MODELS:
            # PyTorch -> egeria
            m = trained_torchvision(tv_name, 1)
            bn = next(mod for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d))
            check(not torch.allclose(bn.running_var, torch.ones_like(bn.running_var)),
                  "%s: torchvision's running statistics moved from their initial values" % tv_name)
            with torch.no_grad():
                want = m(x)
            pth, weights, out = (os.path.join(d, tv_name + s) for s in (".pth", ".safetensors", "_y.safetensors"))
            torch.save(m.state_dict(), pth)
            run([TOOL, pth, weights])
            p = run([interop, "load", eg_name, str(CLASSES), weights, inputs, out])
            err = relative_error(st.load_safetensors(out)["y"], want)
            check(err <= TOLERANCE, "%s: torchvision's weights in egeria, outputs within %.0e (max relative "
                  "error %.2e)" % (tv_name, TOLERANCE, err))
            # egeria -> PyTorch
            eg_weights, eg_out, eg_pth = (os.path.join(d, eg_name + s)
                                          for s in ("_eg.safetensors", "_eg_y.safetensors", "_eg.pth"))
            run([interop, "export", eg_name, str(CLASSES), "3", inputs, eg_weights, eg_out])
            run([TOOL, eg_weights, eg_pth])
            back = getattr(torchvision.models, tv_name)(num_classes=CLASSES)
            back.load_state_dict(torch.load(eg_pth), strict=True)
            back.eval()
            bn = next(mod for mod in back.modules() if isinstance(mod, torch.nn.BatchNorm2d))
            check(not torch.allclose(bn.running_var, torch.ones_like(bn.running_var)),
                  "%s: egeria's running statistics moved from their initial values" % tv_name)
            with torch.no_grad():
                got = back(x)
            err = relative_error(got, st.load_safetensors(eg_out)["y"])
            check(err <= TOLERANCE, "%s: egeria's weights in torchvision (strict=True), outputs within %.0e (max "
                  "relative error %.2e)" % (tv_name, TOLERANCE, err))

        # The wrong file: another architecture's weights, named tensor by tensor.
        p = run([interop, "load", "resnet18", str(CLASSES), os.path.join(d, "resnet50.safetensors"), inputs,
                 os.path.join(d, "wrong.safetensors")], expect_ok=False)
        check(p.returncode != 0 and "other shapes in the file" in p.stderr and "layer1.0.conv1.weight" in p.stderr,
              "resnet50's weights into resnet18: refused, naming the tensors (%s)" % p.stderr.strip()[:160])
        p = run([interop, "load", "resnet18", str(CLASSES), os.path.join(d, "mobilenet_v2.safetensors"), inputs,
                 os.path.join(d, "wrong.safetensors")], expect_ok=False)
        check(p.returncode != 0 and "none of its" in p.stderr and "features.0.0.weight" in p.stderr,
              "mobilenet_v2's weights into resnet18: refused, naming what did not match")
        # The converter: a pickled list, and a pickled model object, are not state dicts.
        torch.save([1, 2, 3], os.path.join(d, "list.pth"))
        p = run([TOOL, os.path.join(d, "list.pth"), os.path.join(d, "list.safetensors")], expect_ok=False)
        check(p.returncode == 2 and "is not a state dict" in p.stderr, "a .pth of a list: 'is not a state dict'")
        torch.save(trained_torchvision("resnet18", 2), os.path.join(d, "whole.pth"))
        p = run([TOOL, os.path.join(d, "whole.pth"), os.path.join(d, "whole.safetensors")], expect_ok=False)
        check(p.returncode == 2 and "--trust-pickle" in p.stderr, "a pickled model object: named, not run")

        # `egeria export` of a run: a resnet18 fine-tuned on a tiny image folder.
        from PIL import Image
        for split in ("train", "val"):
            for k, colour in enumerate(((200, 30, 30), (30, 30, 200))):
                os.makedirs(os.path.join(d, "folder", split, "c%d" % k))
                for i in range(4):
                    img = Image.new("RGB", (80, 80), tuple(max(0, c - 20 * i) for c in colour))
                    img.save(os.path.join(d, "folder", split, "c%d" % k, "%d.png" % i))
        tv18 = os.path.join(d, "resnet18.safetensors")  # 7 classes: the head is initialised afresh for 2
        run_dir = os.path.join(d, "run")
        p = run([cli, "train", "--model", "resnet18", "--dataset", "imagefolder", "--data-dir",
                 os.path.join(d, "folder"), "--image-size", "72", "--epochs", "1", "--batch-size", "4",
                 "--freeze", "none", "--init-from", tv18, "--threads", "2", "--out", run_dir])
        check("in torchvision's resnet18 names" in p.stdout and "other shapes, left as initialised: fc.bias" in p.stdout,
              "train --init-from torchvision's resnet18: reported in torchvision's names, the new head named")
        exported = os.path.join(d, "exported.safetensors")
        p = run([cli, "export", "--out", run_dir, "--format", "torchvision", "--to", exported])
        check("resnet18(num_classes=2)" in p.stdout, "egeria export names torchvision's builder: " + p.stdout.strip())
        run([TOOL, exported, os.path.join(d, "exported.pth")])
        back = torchvision.models.resnet18(num_classes=2)
        back.load_state_dict(torch.load(os.path.join(d, "exported.pth")), strict=True)
        x72 = torch.randn(2, 3, 72, 72)
        st.save_safetensors({"x": x72}, os.path.join(d, "x72.safetensors"))
        run([interop, "load", "resnet18", "2", exported, os.path.join(d, "x72.safetensors"),
             os.path.join(d, "y72.safetensors")])
        with torch.no_grad():
            err = relative_error(st.load_safetensors(os.path.join(d, "y72.safetensors"))["y"], back.eval()(x72))
        check(err <= TOLERANCE, "egeria export: torchvision's outputs are egeria's (max relative error %.2e)" % err)
        # egeria eval --init-from of a torchvision-trained resnet18: PyTorch's accuracy and loss on the same
        # images (80-pixel images, 70-pixel centre crops: egeria's evaluation resizes to 70 / 0.875 = 80, a no-op).
        import torchvision.transforms as T
        tf = T.Compose([T.CenterCrop(70), T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        noisy = os.path.join(d, "noisy")
        g = torch.Generator().manual_seed(3)
        for split in ("train", "val"):
            for k in range(3):
                os.makedirs(os.path.join(noisy, split, "class%d" % k))
                for i in range(8):
                    px = (torch.rand(80, 80, 3, generator=g) * 160 + 40 * k).clamp(0, 255).to(torch.uint8)
                    Image.fromarray(px.numpy()).save(os.path.join(noisy, split, "class%d" % k, "%d.png" % i))
        data = torchvision.datasets.ImageFolder(os.path.join(noisy, "train"), tf)
        torch.manual_seed(4)
        m = torchvision.models.resnet18(num_classes=3)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        xs, ys = torch.stack([x for x, _ in data]), torch.tensor([y for _, y in data])
        for step in range(4):
            loss = torch.nn.functional.cross_entropy(m.train()(xs), ys)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val = torchvision.datasets.ImageFolder(os.path.join(noisy, "val"), tf)
        xv, yv = torch.stack([x for x, _ in val]), torch.tensor([y for _, y in val])
        with torch.no_grad():
            logits = m.eval()(xv)
        want_acc = float((logits.argmax(1) == yv).float().mean())
        want_loss = float(torch.nn.functional.cross_entropy(logits, yv))
        torch.save(m.state_dict(), os.path.join(d, "noisy.pth"))
        run([TOOL, os.path.join(d, "noisy.pth"), os.path.join(d, "noisy.safetensors")])
        p = run([cli, "eval", "--init-from", os.path.join(d, "noisy.safetensors"), "--model", "resnet18",
                 "--dataset", "imagefolder", "--data-dir", noisy, "--image-size", "70"])
        got = json.loads(p.stdout.strip().splitlines()[-1])
        check(abs(got["test_accuracy"] - want_acc) < 1e-6 and abs(got["test_loss"] - want_loss) <= 1e-4 * want_loss,
              "egeria eval --init-from a torchvision-trained resnet18: accuracy %.4f and loss %.6f, PyTorch's %.4f "
              "and %.6f" % (got["test_accuracy"], got["test_loss"], want_acc, want_loss))
        p = run([cli, "train", "--model", "resnet18", "--dataset", "fashion-mnist", "--train-limit", "64",
                 "--batch-size", "16", "--epochs", "1", "--init-from", tv18, "--out", os.path.join(d, "run_fm")], expect_ok=False)
        check(p.returncode != 0 and "ImageNet-sized images" in p.stderr,
              "torchvision's weights on 28x28 images: refused, saying why (%s)" % p.stderr.strip()[:200])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("interop: %d checks held, %d did not" % (len(passes), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
