cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
# Runs kqlora-bench on a small size and checks its JSON: every record of the contract with
# a positive median and a positive byte or flop count; the QLoRA records' pair ratios.
execute_process(COMMAND ${BENCH} --sizes 128 --tokens 16 --linear-dim 128 --gemm-size 64
                        --repeats 2 --pairs 3 --llama tiny --llama-batches 2
                        --llama-seq 16 --delta-tokens 64,128 --json ${OUT} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kqlora-bench failed (${rc}): ${out}${err}")
endif()
file(READ ${OUT} json)
string(JSON n LENGTH "${json}")
set(expected fma_peak_f32 gemm_f32_64 memcpy_128x128_f32 nf4_dequant_128x128_f32 nf4_quant_128x128_f32
             nf4_dequant_128x128_bf16 nf4_quant_128x128_bf16
             qlora_linear_fwd_bwd_t16 dense_lora_linear_fwd_bwd_t16
             llama_fwd_bwd_tiny_b2_t16 llama_attention_fwd_bwd_tiny_b2_t16
             llama_cross_entropy_tiny_b2_t16 llama_lm_head_products_tiny_b2_t16
             llama_lm_head_cross_entropy_tiny_b2_t16)
set(found)
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${json}" ${i} name)
  string(JSON median GET "${json}" ${i} median_s)
  string(JSON bytes GET "${json}" ${i} bytes)
  string(JSON flops GET "${json}" ${i} flops)
  # Every record moves bytes or does flops (fma_peak_f32: flops only).
  if(NOT median GREATER 0 OR (NOT bytes GREATER 0 AND NOT flops GREATER 0))
    message(FATAL_ERROR "record ${name}: median_s ${median}, bytes ${bytes}, flops ${flops}")
  endif()
  if(name MATCHES "^qlora_linear")
    string(JSON ratio GET "${json}" ${i} ratio_to_dense)
    if(NOT ratio GREATER 0)
      message(FATAL_ERROR "record ${name}: ratio_to_dense ${ratio}")
    endif()
  endif()
  list(APPEND found ${name})
endforeach()
foreach(e IN LISTS expected)
  if(NOT e IN_LIST found)
    message(FATAL_ERROR "record ${e} missing from ${OUT}: ${found}")
  endif()
endforeach()

# One step's launch counts (gemm_calls, kernel_launches, deep_copies; fences on Kokkos >=
# 3.6): the tiny shape at 1, 2 and 3 layers (--llama-layers) adds the same counts per
# layer (the step is the layers plus what is not a layer; a layer's projections may take
# the fused NF4 GEMM, kqlora's own kernel, on AVX-512 hosts: no vendor call there), the LM
# head calls GEMMs, a layer launches kernels, and the default tiny shape (2 layers) counts
# what tiny_l2 does.
function(step_counts json name out)
  string(JSON n LENGTH "${json}")
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON rname GET "${json}" ${i} name)
    if(rname STREQUAL name)
      foreach(key gemm_calls kernel_launches deep_copies)
        string(JSON v ERROR_VARIABLE missing GET "${json}" ${i} ${key})
        if(missing OR NOT v MATCHES "^[0-9]+$")
          message(FATAL_ERROR "record ${name}: ${key} missing or not a count (${v})")
        endif()
        set(${out}_${key} ${v} PARENT_SCOPE)
      endforeach()
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "record ${name} missing")
endfunction()
step_counts("${json}" llama_fwd_bwd_tiny_b2_t16 def)
foreach(l 1 2 3)
  execute_process(COMMAND ${BENCH} --filter llama_fwd_bwd --llama tiny --llama-layers ${l}
                          --llama-batches 2 --llama-seq 16 --repeats 1 --json ${OUT}.l${l}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kqlora-bench --llama-layers ${l} failed (${rc}): ${out}${err}")
  endif()
  file(READ ${OUT}.l${l} jl)
  step_counts("${jl}" llama_fwd_bwd_tiny_l${l}_b2_t16 l${l})
endforeach()
foreach(key gemm_calls kernel_launches deep_copies)
  math(EXPR d1 "${l2_${key}} - ${l1_${key}}")
  math(EXPR d2 "${l3_${key}} - ${l2_${key}}")
  if(NOT d1 EQUAL d2 OR d1 LESS 0)
    message(FATAL_ERROR "${key} per step at 1, 2, 3 layers: ${l1_${key}}, ${l2_${key}}, "
                        "${l3_${key}}: not the same count per layer")
  endif()
  if(NOT def_${key} EQUAL l2_${key})
    message(FATAL_ERROR "${key}: tiny (2 layers) ${def_${key}}, tiny_l2 ${l2_${key}}")
  endif()
endforeach()
math(EXPR per_layer "${l2_gemm_calls} - ${l1_gemm_calls}")
math(EXPR kernels_per_layer "${l2_kernel_launches} - ${l1_kernel_launches}")
if(l1_gemm_calls LESS_EQUAL 0 OR kernels_per_layer LESS_EQUAL 0)
  message(FATAL_ERROR "gemm_calls at one layer ${l1_gemm_calls} (the LM head's products at "
                      "least), Kokkos kernels per layer ${kernels_per_layer} (norms at least)")
endif()
message(STATUS "kqlora-bench wrote ${n} records; per step and layer ${per_layer} vendor GEMM "
               "calls, ${l1_gemm_calls} at one layer")
