"""The public names torch_npu's ``torch.npu`` shares with ``torch.cuda``, and the ones that
mean nothing on a simulator (with why). ``tests/test_npu_api_parity.py`` checks the rest.

Where the list comes from: the ``__all__`` of Ascend/pytorch ``torch_npu/npu/__init__.py``
(which re-exports its ``memory``, ``random``, ``streams`` and ``graphs`` submodules' names),
plus the submodules themselves (``amp``, ``memory``, ``random``, ``streams``, ``graphs``),
intersected with ``torch.cuda.__all__`` of torch 2.13.0. Read from the Ascend/pytorch
master branch in December 2026; 92 names.
"""

from __future__ import annotations

SHARED_WITH_CUDA: tuple[str, ...] = (
    "BFloat16Storage", "BFloat16Tensor", "BoolStorage", "BoolTensor", "ByteStorage", "ByteTensor", "CharStorage",
    "CharTensor", "DoubleStorage", "DoubleTensor", "Event", "FloatStorage", "FloatTensor", "HalfStorage",
    "HalfTensor", "IntStorage", "IntTensor", "LongStorage", "LongTensor", "MemPool", "ShortStorage", "ShortTensor",
    "Stream", "StreamContext", "amp", "caching_allocator_alloc", "caching_allocator_delete",
    "can_device_access_peer", "change_current_allocator", "current_blas_handle", "current_device",
    "current_stream", "default_stream", "device", "device_count", "device_of", "empty_cache",
    "get_allocator_backend", "get_device_capability", "get_device_name", "get_device_properties",
    "get_per_process_memory_fraction", "get_rng_state", "get_rng_state_all", "get_sync_debug_mode", "graph",
    "graph_pool_handle", "graphs", "host_memory_stats", "host_memory_stats_as_nested_dict", "init",
    "initial_seed", "ipc_collect", "is_available", "is_bf16_supported", "is_current_stream_capturing",
    "is_initialized", "make_graphed_callables", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory", "memory_allocated", "memory_cached",
    "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
    "random", "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_peak_host_memory_stats",
    "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_per_process_memory_fraction",
    "set_rng_state", "set_rng_state_all", "set_stream", "set_sync_debug_mode", "stream", "streams",
    "synchronize", "use_mem_pool", "utilization",
)

NOT_APPLICABLE: dict[str, str] = {
    "change_current_allocator": "the device core's caching allocator is the only one; pluggable allocators "
                                "are not simulated",
    "current_blas_handle": "there is no BLAS handle: matrix products run PyTorch's CPU kernels",
    "set_sync_debug_mode": "npusim does not intercept synchronizing calls; the mode is stored and returned "
                           "by get_sync_debug_mode, nothing warns or raises",
    "get_sync_debug_mode": "see set_sync_debug_mode",
}

# torch.cuda.CUDAGraph's methods (torch 2.13; the CUDA build's register_generator_state and
# get_currently_capturing_graph included) that torch.npu.NPUGraph has, and those it has not (with why);
# tests/test_npu_api_parity.py checks them against this torch's CUDAGraph.
GRAPH_METHODS_SHARED_WITH_CUDA: tuple[str, ...] = (
    "capture_begin", "capture_end", "debug_dump", "enable_debug_mode", "get_currently_capturing_graph",
    "instantiate", "pool", "register_generator_state", "replay", "reset",
)
GRAPH_METHODS_NOT_APPLICABLE: dict[str, str] = {
    "raw_cuda_graph": "the cudaGraph_t handle: an npu graph is the device core's task list, with no raw handle",
    "raw_cuda_graph_exec": "the cudaGraphExec_t handle: see raw_cuda_graph",
    "get_graph_data": "the CUDA graph's node data for its debug tools; an npu graph has debug_dump instead",
}

# What frameworks written for torch_npu touch inside it, beyond the names above. Read from
# accelerate (src/accelerate: utils/imports.py, state.py, utils/modeling.py), transformers
# (utils/import_utils.py, trainer*.py, integrations/npu_flash_attention.py), DeepSpeed
# (accelerator/real_accelerator.py, npu_accelerator.py), MindSpeed (mindspeed/core, functional, op_builder),
# torchtitan-npu (torchtitan_npu/train.py, converters, patches) and the helpers torch_npu's and
# op-plugin's test files import. Each name is a dotted path under npusim run; tests/test_torch_npu_compat.py
# resolves every one.
FRAMEWORK_PROVIDED: dict[str, str] = {
    "torch_npu": "importlib.util.find_spec / import: accelerate's is_npu_available, transformers' "
                 "is_torch_npu_available, DeepSpeed's accelerator detection",
    "torch_npu.__version__": "2.13.0, the torch_npu release of torch 2.13 (MindSpeed, version checks)",
    "torch_npu.npu": "torch.npu (every framework)",
    "torch_npu.npu.amp.GradScaler": "torch_npu's scaler rule (accelerate's get_grad_scaler)",
    "torch_npu.npu.graphs": "torch.npu.graphs, npusim's NPU graphs",
    "torch_npu.npu._graph_tree.NPUGraphTreeManager": "npusim's npu graph trees of mode='reduce-overhead' "
                                                     "(torch_npu's test/npu/test_graph_tree.py)",
    "torch_npu.npu.utils._get_device_index": "torch_npu's device-index helper",
    "torch_npu.npu.utils.get_cann_version": "the profile's CANN version (torch_npu's test helpers)",
    "torch_npu.npu.aclnn": "allow_hf32 (conv's flag, stored) and flags() (torch_npu's test_torch_backends)",
    "torch_npu.npu.enable_flash_sdp": "PyTorch's SDP flags, as torch_npu.npu's _backends; math / mem_efficient too",
    "torch_npu.npu.preferred_linalg_library": "Default for every backend, as torch_npu's",
    "torch_npu.npu.enable_deterministic_with_backward": "use_deterministic_algorithms over a forward and backward "
                                                        "region (and disable_deterministic_with_backward)",
    "torch_npu.npu.utils.get_soc_version": "the simulated SoC's SocVersion number (torch_npu's test_allocator_envs)",
    "torch_npu.npu.utils._is_gte_cann_version": "compares with the profile's CANN version",
    "torch_npu.npu.utils.npu_check_overflow": "torch_npu's INF_NAN-mode rule: an infinite or NaN sum "
                                              "(torch_npu's ShardedGradScaler, test_check_over_flow)",
    "torch_npu.npu.get_npu_overflow_flag": "refused as torch_npu refuses it on an INF_NAN SoC, naming "
                                           "npu_check_overflow",
    "torch_npu.npu.clear_npu_overflow_flag": "warns that it is useless on an INF_NAN SoC, as torch_npu does",
    "torch_npu.npu._lazy_call": "runs the callable now (MindSpeed's tensor_parallel.random, DeepSpeed)",
    "torch_npu.utils.get_cann_version": "the profile's CANN version",
    "torch_npu.utils.collect_env.get_cann_version": "the profile's CANN version (MindSpeed's MoE dispatchers)",
    "torch_npu._C._distributed_c10d.ProcessGroupHCCL": "the class of npusim's hccl backend",
    "torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options": "backend options the hccl backend takes "
        "(torchtitan-npu's expert-parallel mesh, MindSpeed's hccl_config buffers); Note [hccl options]",
    "torch_npu._C._npu_getCurrentRawStream": "the current stream's id (torch_npu's inductor and dynamo code)",
    "torch_npu._C._npu_sleep": "torch.npu._sleep",
    "torch_npu._C._npu_getCurrentRawStreamNoWait": "the current stream's id: npusim has no task queue to drain "
                                                   "first (torch_npu's inductor probes for it)",
    "torch_npu._C._npu_get_soc_version": "the simulated SoC's SocVersion number (torch_npu's test files)",
    "torch_npu._C._empty_strided_npu": "an uninitialised tensor on the current npu (torch_npu's inductor wrapper)",
    "torch_npu._C._npu_checkPoolLiveAllocations": "a graph pool's allocated blocks against the expected addresses "
                                                  "(torch_npu's _graph_tree.check_memory_pool)",
    "torch_npu._C._weak_ref_tensor": "a tensor over another's memory that does not keep it alive (torch_npu's "
                                     "graph tree tests)",
    "torch_npu._C._npu_isHistoryEnabled": "whether _record_memory_history is recording (enable_history_recording)",
    "torch_npu.hifloat8": "torch_npu's custom dtype number (ACL's + 256); the ops computing in it are not "
                          "simulated (MindSpeed, torchtitan-npu)",
    "torch_npu.float8_e8m0fnu": "torch_npu's custom dtype number (MindSpeed, torchtitan-npu)",
    "torch_npu.float4_e2m1fn_x2": "torch_npu's custom dtype number (op-plugin's quantized ops' dtype arguments)",
    "torch_npu.get_storage_size": "the element count of an npu tensor's storage, an npu operator as on torch_npu "
                                  "(torch_npu's combine_tensors, tests)",
    "torch_npu.npu.SyncLaunchStream": "a stream launched from the calling thread, as every npusim stream is "
                                      "(Note [Sync-launch streams])",
    "torch_npu.npu.OutOfMemoryError": "torch.OutOfMemoryError, what the caching allocator raises",
    "torch_npu.npu.use_compatible_impl": "stored as torch_npu's TORCH_NPU_USE_COMPATIBLE_IMPL option",
    "torch_npu.npu._memory_viz.segments": "flame graphs of npu memory snapshots, torch.cuda._memory_viz's format",
    "torch_npu.npu._graph_tree.check_memory_pool": "a graph tree pool's live blocks against the live storages",
    "torch_npu.utils._path_manager.PathManager": "torch_npu's checked file-system helpers (its tests' folders)",
    "torch_npu.contrib.module.LabelSmoothingCrossEntropy": "torch_npu's drop-in modules PyTorch's operators "
                                                           "compute (ChannelShuffle, Focus, Mish, SiLU too)",
    "torch_npu._inductor": "imports dynamo and inductor, so npusim's inductor backend is registered "
                           "(torchtitan-npu's compile path)",
    "torchair.get_npu_backend": "torchair's compile backend, npusim's inductor backend in the config's mode "
                                "(Note [torchair in npusim]; MindSpeed's graph-mode tests)",
    "torch_npu.dynamo.torchair.CompilerConfig": "torchair's configuration: mode checked, graph-engine options kept",
    "torchair.configs.compiler_config.CompilerConfig": "torchair's configuration (MindSpeed's tests)",
    "torchair.register_fx_node_ge_converter": "records a GE converter, never run (MindSpeed's op builders)",
    "torchair.ge.DataType": "GE's dtype numbering (MindSpeed's op builders' converters)",
    "torchair.ge.TensorSpec": "a converter's annotation (MindSpeed's op builders)",
    "torchair.ge_concrete_graph.fx2ge_converter.register_fx_node_ge_converter": "torchair's first API "
        "(MindSpeed's fallback imports)",
    "torchair.patch_for_hcom": "logs that torch >= 2.3.1 needs no patch, as torchair does",
    "torch_npu.contrib.transfer_to_npu": "CUDA-written code on the npu: cuda devices, torch.cuda's names, nccl "
                                         "as hccl (MindSpeed's megatron adaptor, CUDA scripts)",
    "torch_npu.npu_fusion_attention": "op-plugin's fused attention, npusim.ops.fused (transformers' NPU flash "
                                      "attention, torchtitan-npu, MindSpeed)",
    "torch_npu.npu_rms_norm": "op-plugin's RMSNorm, npusim.ops.fused (torchtitan-npu's converter, MindSpeed)",
    "torch_npu.testing.testcase.TestCase": "torch_npu's test case (op-plugin's and torch_npu's test files)",
    "torch_npu.testing.testcase.run_tests": "unittest.main",
    "torch_npu.testing.common_utils.SupportedDevices": "skips unless the simulated SoC is listed",
    "torch_npu.testing.common_utils.SkipIfNotGteCANNVersion": "skips below the profile's CANN version",
    "torch_npu.testing.common_utils.create_common_tensor": "CPU and npu inputs from NumPy",
    "torch_npu.testing.common_utils.freeze_rng_state": "restores the CPU and npu generators",
    "torch_npu.testing.common_utils._create_scaling_case": "torch_npu's GradScaler test case",
    "torch_npu.testing.common_utils._create_scaling_models_optimizers": "torch_npu's GradScaler test models",
    "torch_npu.testing.common_distributed.skipIfUnsupportMultiNPU": "skips without enough simulated npus",
    "torch_npu.testing.common_distributed.with_comms": "an hccl (or gloo) group around a test",
    "torch_npu.testing.decorator.instantiate_tests": "dtype / format parametrisation",
    "torch_npu.testing._internal.common_fsdp.FSDPNPUTest": "PyTorch's FSDPTest on npu over hccl",
    "torch.backends.npu.matmul": "PyTorch's global matmul flags (allow_tf32 follows set_float32_matmul_precision)",
    "torch.npu.host_empty_cache": "nothing to release: pinned blocks are not cached",
    "torch.npu.get_arch_list": "the simulated SoC",
    "torch.npu._sleep": "a delay task on the current stream (the profile's clock_mhz)",
    "torch.npu.memory._set_allocator_settings": "re-parses torch_npu's run-time keys (Note [Allocator settings])",
    "torch.npu.default_generators": "one Philox generator per device (DeepSpeed's accelerator)",
    "torch.npu.set_option": "stored (MindSpeed)",
    "torch_npu.profiler.profile": "torch.profiler with torch_npu's arguments; writes torch_npu's *_ascend_pt views "
                                  "(torchtitan-npu, MindSpeed)",
    "torch_npu.profiler.tensorboard_trace_handler": "writes <worker>_<time>_ascend_pt with ASCEND_PROFILER_OUTPUT "
                                                    "(MindSpeed's profiling options)",
    "torch_npu.profiler._ExperimentalConfig": "profiler_level kept; PMU metrics and the db export refused by name",
}

FRAMEWORK_REFUSED: dict[str, str] = {
    "torch_npu.npu_quant_matmul": "quantized matmul: no quantized kernels (torchtitan-npu, MindSpeed)",
    "torch_npu.npu_dynamic_mx_quant": "MX quantization: no such kernels (torchtitan-npu)",
    "torch_npu.empty_with_swapped_memory": "host-swapped device memory is not simulated (MindSpeed)",
    "torch_npu.optim": "torch_npu's fused optimizers (transformers' NpuFusedAdamW)",
    "torchair.dynamo_export": "exporting graph-engine models (.air / .om) needs Ascend's graph engine",
    "torch_npu.distributed": "torch_npu.distributed's extensions (ParallelStore, uneven collectives)",
    "torch_npu.op_plugin": "op-plugin's meta registrations are npusim.ops.fused's (torchtitan-npu's entry)",
    "torch_npu.asd": "silent-data-corruption detection (MindSpeed's register_asd_hook)",
    "torch_npu.utils.flops_count": "torch_npu's FLOP counter (MindSpeed)",
    "torch_npu._inductor.lowering": "triton-ascend lowerings (torchtitan-npu's bypass_triton_codegen)",
    "torch_npu._C._distributed_c10d.ProcessGroupLCCL": "torch_npu's LCCL backend",
    "torch_npu.contrib.module.DCNv2": "torch_npu's modules over op-plugin kernels npusim has not (deformable "
                                      "convolution, ROI align, quantized linear layers, ...)",
}

# The fused operators torch_npu puts in its ``__all__``: the entries of op-plugin's
# op_plugin/config/op_plugin_functions.yaml (sections custom and custom_autograd) and of torch_npu's
# npu_native_functions.yaml whose ``exposed`` covers torch 2.13 (True, all_version or a version range
# reaching v2.13: npu_fused_infer_attention_score is exposed for v2.1 only), which torch_npu's build writes to
# torch_npu/utils/exposed_api.py and its _init/core/_exports.py adds to ``torch_npu.__all__`` when the op
# exists. Read from Ascend/op-plugin and Ascend/pytorch master in December 2026; 119 names. npusim's
# ``torch_npu.__all__`` is the part of it npusim defines (ops.fused.OPS), so it grows as operators come.
TORCH_NPU_EXPOSED_OPS: frozenset[str] = frozenset({
    "_npu_dropout", "empty_with_swapped_memory", "fast_gelu", "npu_advance_step_flashattn", "npu_all_gather_base_mm",
    "npu_alloc_float_status", "npu_alltoallv_gmm", "npu_alltoallv_quant_gmm", "npu_anchor_response_flags",
    "npu_anti_quant", "npu_apply_rotary_pos_emb", "npu_batch_nms", "npu_bert_apply_adam",
    "npu_block_sparse_attention", "npu_bmmV2", "npu_bounding_box_decode", "npu_bounding_box_encode", "npu_ciou",
    "npu_clear_float_status", "npu_clipped_swiglu", "npu_confusion_transpose", "npu_conv3d",
    "npu_convert_weight_to_int4pack", "npu_cross_entropy_loss", "npu_deformable_conv2d",
    "npu_dense_lightning_indexer_grad_kl_loss", "npu_dense_lightning_indexer_softmax_lse", "npu_diou",
    "npu_dropout_with_add_softmax", "npu_dynamic_block_quant", "npu_dynamic_quant", "npu_dynamic_quant_asymmetric",
    "npu_fast_gelu", "npu_ffn", "npu_format_cast", "npu_format_cast_", "npu_fused_attention_score",
    "npu_fused_causal_conv1d", "npu_fusion_attention", "npu_gather_sparse_index", "npu_gelu_mul",
    "npu_get_float_status", "npu_giou", "npu_gmm_alltoallv", "npu_grid_assign_positive", "npu_group_norm_silu",
    "npu_group_norm_swish", "npu_grouped_matmul", "npu_grouped_matmul_finalize_routing", "npu_incre_flash_attention",
    "npu_indexing", "npu_iou", "npu_kv_quant_sparse_flash_attention", "npu_lightning_indexer", "npu_linear",
    "npu_lstm", "npu_masked_causal_conv1d", "npu_max", "npu_mhc_post", "npu_mhc_post_backward", "npu_mhc_sinkhorn",
    "npu_mla_prolog", "npu_mla_prolog_v2", "npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base",
    "npu_moe_compute_expert_tokens", "npu_moe_finalize_routing", "npu_moe_gating_top_k_backward",
    "npu_moe_gating_top_k_softmax", "npu_moe_gating_top_k_softmax_v2", "npu_moe_init_routing",
    "npu_moe_update_expert", "npu_mrope", "npu_multi_head_attention", "npu_nms_v4", "npu_nms_with_mask",
    "npu_one_hot", "npu_pad", "npu_prefetch", "npu_prompt_flash_attention", "npu_ps_roi_pooling",
    "npu_quant_gmm_alltoallv", "npu_quant_lightning_indexer", "npu_quant_matmul", "npu_quant_matmul_gelu",
    "npu_quant_matmul_reduce_sum", "npu_quant_scatter", "npu_quant_scatter_", "npu_quantize",
    "npu_random_choice_with_mask", "npu_recurrent_gated_delta_rule", "npu_recurrent_gated_delta_rule_functional",
    "npu_ring_attention_update", "npu_rms_norm", "npu_roi_align", "npu_rotary_mul", "npu_rotate_quant",
    "npu_rotated_iou", "npu_rotated_overlaps", "npu_scaled_masked_softmax", "npu_scatter_nd_update",
    "npu_scatter_nd_update_", "npu_scatter_pa_kv_cache", "npu_sign_bits_pack", "npu_sign_bits_unpack",
    "npu_sim_exponential_", "npu_slice", "npu_softmax_cross_entropy_with_logits", "npu_sparse_flash_attention",
    "npu_sparse_lightning_indexer_grad_kl_loss", "npu_swiglu", "npu_trans_quant_param", "npu_transpose",
    "npu_transpose_batchmatmul", "npu_transpose_quant_batchmatmul", "npu_weight_quant_batchmatmul",
    "npu_yolo_boxes_encode", "scatter_update", "scatter_update_",
})
