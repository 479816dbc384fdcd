// STRATA_API marks the symbols the shared library exports; everything else stays hidden.
#pragma once

#if defined(_WIN32)
#if defined(STRATA_BUILDING_LIBRARY)
#define STRATA_API __declspec(dllexport)
#else
#define STRATA_API __declspec(dllimport)
#endif
#else
#define STRATA_API __attribute__((visibility("default")))
#endif
