// The whole user API of minigrad in one include.
#pragma once

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/error.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/shape.h>
#include <minigrad/core/stream.h>
#include <minigrad/core/tensor.h>
#include <minigrad/nn/init.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/module.h>
