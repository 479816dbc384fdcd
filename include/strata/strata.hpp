// The one header a strata program includes.
#pragma once

#include <strata/version.hpp>

#include <strata/core/allocator.hpp>
#include <strata/core/device.hpp>
#include <strata/core/dtype.hpp>
#include <strata/core/error.hpp>
#include <strata/core/format.hpp>
#include <strata/core/generator.hpp>
#include <strata/core/registry.hpp>
#include <strata/core/scalar.hpp>
#include <strata/core/shape.hpp>
#include <strata/core/storage.hpp>
#include <strata/core/tensor.hpp>
#include <strata/core/threads.hpp>

#include <strata/ops/binary.hpp>
#include <strata/ops/compare.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/sort.hpp>
#include <strata/ops/unary.hpp>
