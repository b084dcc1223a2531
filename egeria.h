// The public API in one include: tensors, differentiable functions, layers,
// optimizers, schedules and data readers.
#pragma once
#include "autograd/functions.h"
#include "autograd/node.h"
#include "cache/activation_cache.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/idx.h"
#include "freeze/plasticity.h"
#include "freeze/policy.h"
#include "freeze/tracker.h"
#include "layers/attention.h"
#include "layers/layers.h"
#include "layers/module.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/trainer.h"
