cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
# Runs kqlora-bench on a small size and checks its JSON: every record of the contract with
# a positive median and a positive byte or flop count; the QLoRA records' pair ratios.
execute_process(COMMAND ${BENCH} --sizes 128 --tokens 16 --linear-dim 128 --gemm-size 64
                        --repeats 2 --pairs 3 --llama tiny --llama-batches 2
                        --llama-seq 16 --json ${OUT} RESULT_VARIABLE rc
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
message(STATUS "kqlora-bench wrote ${n} records")
