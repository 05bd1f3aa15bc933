// Precompiled header: the heavy LibTorch headers every translation unit includes.
#pragma once
#include <torch/torch.h>
