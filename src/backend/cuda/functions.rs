//! The kernel functions of the loaded modules: the base module's, and the
//! format kernels of each weight format code (see `compile.rs`).

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CString;

macro_rules! kernels {
    ($(#[$doc:meta])* $ty:ident { $($name:ident),* $(,)? }) => {
        $(#[$doc])*
        pub(crate) struct $ty {
            $(pub $name: sys::CUfunction,)*
        }
        impl $ty {
            /// Each kernel from the first of `modules` that holds it.
            pub(crate) fn load(modules: &[sys::CUmodule]) -> Result<$ty> {
                Ok($ty { $($name: function(modules, stringify!($name))?,)* })
            }
        }
    };
}

kernels!(
    /// The kernels of the base module: every kernel that does not
    /// depend on the weight format.
    BaseKernels {
        matvec_q,
        rms_norm,
        rms_norm_rows,
        add,
        add_units,
        publish,
        add_scaled_rows,
        swiglu,
        sigmoid_mul,
        copy_strided,
        rope,
        rope_seqs,
        kv_append,
        kv_store,
        kv_load,
        attention,
        attention_split,
        attention_decode,
        attention_decode16,
        attention_decode8,
        attention_merge,
        flash_attention64,
        flash_attention128,
        flash_attention256,
        mla_attention,
        delta_conv,
        delta_prep,
        delta_step,
        delta_scan,
        delta_scan128,
        delta_chunk_prep,
        delta_chunk_scan,
        moe_route,
        moe_route_warp,
        moe_route_split,
        moe_combine,
        moe_count,
        moe_scatter,
        to_half,
    }
);

kernels!(
    /// The kernels of one format module (`FOR_FMT` in `kernels/matvec.cu`).
    FormatKernels {
        matvec,
        matvec_tok4,
        matvec_tok8,
        gemm,
        embed,
        moe_up,
        moe_up_routed,
        moe_up_mt,
        moe_down,
        moe_down_combine,
        moe_down_mt,
        gemm_tc,
        gemm_tc16,
        tc_parts_sum,
        moe_up_tc,
        moe_up_tc16,
        moe_up_tc32,
        moe_down_tc,
        moe_down_tc16,
        moe_down_tc32,
        matvec_qt,
        matvec_tc,
    }
);

/// Every kernel: the base module's, and the format kernels of each format
/// code (see `compile.rs`).
pub(crate) struct Kernels {
    pub base: BaseKernels,
    pub formats: Vec<(i32, FormatKernels)>,
}

impl std::ops::Deref for Kernels {
    type Target = BaseKernels;
    fn deref(&self) -> &BaseKernels {
        &self.base
    }
}

impl Kernels {
    /// The format kernels for weight format code `fmt` (`MatArg::fmt`,
    /// `ELayout::fmt`).
    pub fn fmt(&self, fmt: i32) -> Result<&FormatKernels> {
        self.formats
            .iter()
            .find(|(c, _)| *c == fmt)
            .map(|(_, k)| k)
            .ok_or_else(|| Error::Backend {
                backend: "cuda",
                msg: format!(
                    "no kernels for weight format code {fmt}: the device was opened for the formats {:?}",
                    self.formats.iter().map(|(c, _)| *c).collect::<Vec<_>>()
                ),
            })
    }
}

fn function(modules: &[sys::CUmodule], name: &str) -> Result<sys::CUfunction> {
    let cname = CString::new(name).map_err(|_| Error::Invalid(format!("kernel name {name}")))?;
    for &module in modules {
        let mut f = std::ptr::null_mut();
        // SAFETY: `module` is loaded and `cname` outlives the call.
        if unsafe { sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()) } == sys::CUresult::CUDA_SUCCESS {
            return Ok(f);
        }
    }
    Err(Error::Backend {
        backend: "cuda",
        msg: format!("kernel `{name}` is in none of the loaded modules"),
    })
}
