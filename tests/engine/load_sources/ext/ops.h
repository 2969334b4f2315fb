// Found from bindings.cpp's folder: torch compiles the files in place.
#pragma once

torch::Tensor scale_add(torch::Tensor x, double s);
constexpr int kOpsVersion = 3;
