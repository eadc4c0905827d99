//! Tests of the CUDA backend that need no GPU: what a machine without CUDA (or a build without
//! the feature) answers, and the kernel table's check. The tests that need a GPU are in
//! `tests/cuda_gpu.rs`; they say they were skipped, and why, where there is none.

use super::*;

#[test]
fn without_a_gpu_the_backend_says_why_in_one_line() {
    match gpus() {
        // A machine with a GPU: nothing to check here (tests/cuda_gpu.rs runs on it).
        Ok(found) => assert!(!found.is_empty()),
        Err(error) => {
            let line = error.to_string();
            assert!(!line.contains('\n'), "{line}");
            match BUILT {
                false => assert!(matches!(error, CudaError::NotCompiled), "{line}"),
                true => assert!(
                    matches!(error, CudaError::NoDriver | CudaError::NoDevice { .. }),
                    "{line}"
                ),
            }
        }
    }
}

#[test]
fn a_kernel_table_without_the_attention_kernels_is_refused_by_name() {
    let signature = |name: &str| KernelSignature {
        name: name.to_string(),
        params: Vec::new(),
        grid: KernelGrid::GridStride {
            items: vec!["n".to_string()],
            divisor: 1,
        },
    };
    let mut source = KernelSource {
        ptx: String::new(),
        kernels: REQUIRED_KERNELS
            .iter()
            .map(|name| signature(name))
            .collect(),
    };
    source.check().unwrap();
    source
        .kernels
        .retain(|kernel| kernel.name != "slimpack_attention_bwd_dkv");
    let error = source.check().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the PTX module has no kernel slimpack_attention_bwd_dkv (built by a codegen without it)"
    );
}
