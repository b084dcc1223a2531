#!/usr/bin/env python3
"""bench/cpu_step.py's reading of oneDNN's verbose log and its table (no benchmark here).

python3 tests/test_cpu_step.py (ctest: Bench.CpuStep)
"""
import importlib.util
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("cpu_step", os.path.join(HERE, "..", "bench", "cpu_step.py"))
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)

# oneDNN 2.6's lines (the issue's AMX log's shape), one of the older prefix, and noise.
LOG = """onednn_verbose,info,oneDNN v2.6.0 (commit N/A)
onednn_verbose,create:cache_miss,cpu,convolution,brgconv:avx512_core_amx_bf16,forward_training,src_bf16::blocked:acdb:f0 wei_bf16::blocked:AcdB16b16a2b:f0 bia_undef::undef::f0 dst_bf16::blocked:acdb:f0,,alg:convolution_direct,mb128_ic16oc16_ih32oh32kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,1.5
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_bf16::blocked:aBcd16b:f0 dst_bf16::blocked:acdb:f0,,,128x16x32x32,0.25
onednn_verbose,exec,cpu,convolution,brgconv:avx512_core_amx_bf16,forward_training,src_bf16::blocked:acdb:f0 wei_bf16::blocked:AcdB16b16a2b:f0 bia_undef::undef::f0 dst_bf16::blocked:acdb:f0,,alg:convolution_direct,mb128_ic16oc16_ih32oh32kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,2.0
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_bf16::blocked:acdb:f0 dst_bf16::blocked:aBcd16b:f0,,,128x16x32x32,0.75
dnnl_verbose,exec,cpu,convolution,jit:avx512_core,backward_data,src_f32::blocked:aBcd16b:f0 wei_f32::blocked:ABcd16b16a:f0 bia_undef::undef::f0 dst_f32::blocked:aBcd16b:f0,,alg:convolution_direct,mb128_ic16oc16_ih32oh32kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,3.0
{"images_per_second": 1}
"""


class CpuStep(unittest.TestCase):
    def test_verbose_is_summed_by_kind_and_implementation(self):
        kinds, impls, src, dropped = cs.parse_verbose(LOG)
        self.assertEqual(dropped, 0)
        self.assertEqual(kinds["reorder"], {"count": 2, "ms": 1.0})
        self.assertEqual(kinds["convolution"], {"count": 2, "ms": 5.0})  # exec lines only: not the creation's
        self.assertEqual(impls["convolution brgconv:avx512_core_amx_bf16"]["count"], 1)
        self.assertEqual(impls["convolution jit:avx512_core"]["ms"], 3.0)
        self.assertEqual(src, {"acdb": 1, "aBcd16b": 1})

    def test_summary_is_per_step(self):
        s = cs.onednn_summary(LOG, steps=2)
        self.assertEqual(s["reorders_per_step"], 1.0)
        self.assertEqual(s["reorder_ms_per_step"], 0.5)
        self.assertEqual(s["onednn_ms_per_step"], 3.0)
        self.assertAlmostEqual(s["reorder_share_of_onednn"], 1.0 / 6.0)
        self.assertEqual(list(s["by_implementation"])[0], "convolution jit:avx512_core", "slowest first")

    def test_the_warm_up_steps_are_left_out_where_the_log_splits_into_steps(self):
        s = cs.onednn_summary(LOG, steps=1, warmup=1)  # 4 exec lines: 2 a step, the first 2 left out
        self.assertEqual((s["steps_logged"], s["warmup_steps_left_out"]), (1, 1))
        self.assertEqual(s["reorders_per_step"], 1.0)
        self.assertEqual(s["reorder_ms_per_step"], 0.75)
        self.assertEqual(s["onednn_ms_per_step"], 3.75)
        self.assertEqual(s["convolution_source_layouts"], {"aBcd16b": 1})
        s = cs.onednn_summary(LOG, steps=2, warmup=1)  # 4 lines are not 3 equal steps: all counted
        self.assertEqual((s["steps_logged"], s["warmup_steps_left_out"]), (3, 0))
        self.assertAlmostEqual(s["onednn_ms_per_step"], 6.0 / 3)

    def test_table_has_a_row_per_run(self):
        r = {"model": "resnet56", "batch_size": 128, "precision": "bf16",
             "egeria_images_per_second": {"auto": 850.4, "nhwc": 690.0}, "pytorch_images_per_second": 550.0,
             "ratio_median_of_repeats": {"auto": 1.55, "nhwc": 1.25},
             "onednn": {"reorders_per_step": 1.0, "reorder_ms_per_step": 0.5},
             "profile": {"layout_conversions_per_step": 2.0, "layout_conversion_ms_per_step": 0.25}}
        t = cs.table([r]).splitlines()
        self.assertEqual(len(t), 3)
        self.assertIn("egeria auto | egeria nhwc | PyTorch", t[0])
        self.assertEqual(t[2], "| resnet56 | 128 | bf16 | 850 | 690 | 550 | 1.55× | 1 (0.5) | 2 (0.2) |")
        self.assertEqual(t[1].count("|"), t[0].count("|"))

    def test_both_steps_are_broken_down_into_the_same_categories(self):
        eg = {"mean_step_ms": 100.0, "outside_ops_ms_per_step": 1.0,
              "ops": [{"op": "conv2d_fwd", "ms_per_step": 30.0}, {"op": "conv2d_bwd_data", "ms_per_step": 20.0},
                      {"op": "conv2d_bwd_weight", "ms_per_step": 25.0}, {"op": "batchnorm_bwd", "ms_per_step": 9.0},
                      {"op": "batchnorm_fwd_train", "ms_per_step": 6.0}, {"op": "sgd_step_multi", "ms_per_step": 0.5},
                      {"op": "cast", "ms_per_step": 0.75}, {"op": "global_avgpool_fwd", "ms_per_step": 0.25}]}
        pt = {"step_ms": 150.0, "optimizer_ms": 4.0,
              "ops_ms": {"aten::mkldnn_convolution": 40.0, "aten::convolution_backward": 60.0,
                         "autograd::engine::evaluate_function: ConvolutionBackward0": 1.0,
                         "aten::native_batch_norm": 10.0, "aten::native_batch_norm_backward": 15.0,
                         "aten::relu_": 3.0, "aten::threshold_backward": 2.0, "aten::add": 1.0,
                         "aten::_to_copy": 5.0, "aten::addmm": 0.5, "aten::empty": 0.5}}
        b = cs.step_breakdown(eg, pt)
        e, p = b["egeria_ms"], b["pytorch_ms"]
        self.assertEqual(list(e), list(cs.CATEGORIES))
        self.assertEqual(e["convolutions, forward"], 30.0)
        self.assertEqual(e["convolutions, backward"], 45.0)
        self.assertEqual(e["batch norm, ReLU, residual adds"], 15.0)
        self.assertEqual((e["optimizer"], e["casts"], e["other ops"], e["outside ops"]), (0.5, 0.75, 0.25, 1.0))
        self.assertEqual(p["convolutions, forward"], 40.0)
        self.assertEqual(p["convolutions, backward"], 61.0)
        self.assertEqual(p["batch norm, ReLU, residual adds"], 31.0)
        self.assertEqual((p["optimizer"], p["casts"], p["other ops"]), (4.0, 5.0, 1.0))
        self.assertEqual(p["outside ops"], 150.0 - 142.0)
        self.assertEqual((b["egeria_step_ms"], b["pytorch_step_ms"]), (100.0, 150.0))
        self.assertNotIn("pytorch_ms", cs.step_breakdown(eg))

    def test_breakdown_table_pairs_the_engines(self):
        eg = {"mean_step_ms": 10.0, "outside_ops_ms_per_step": 0.5, "ops": [{"op": "conv2d_fwd", "ms_per_step": 9.5}]}
        r = {"model": "resnet56", "precision": "bf16", "breakdown": cs.step_breakdown(eg)}
        t = cs.breakdown_table([r]).splitlines()
        self.assertEqual(t[0], "| ms a step | resnet56 bf16 egeria | PyTorch |")
        self.assertEqual(t[2], "| convolutions, forward | 9.5 | — |")
        self.assertEqual(t[-1], "| step | 10.0 | — |")
        self.assertEqual(len(t), 2 + len(cs.CATEGORIES) + 1)


if __name__ == "__main__":
    unittest.main()
