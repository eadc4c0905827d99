//! What a caller must know to launch a kernel: its entry name, its parameters in order, and its
//! launch geometry. [`super::KERNELS`] lists one [`KernelSpec`] per kernel; the kernel builder
//! declares each entry point from its spec, so the table and the PTX cannot disagree.
//!
//! These are plain data (no LLVM types), for the CUDA runtime that loads the PTX and for the
//! host emulation ([`super::host`]) that runs the same kernels on the CPU.

/// One kernel parameter's type, as the launcher passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A device `float*` (global memory).
    F32Ptr,
    /// A device `int32_t*` (global memory).
    I32Ptr,
    /// A 64-bit count (`int64_t`).
    I64,
    /// A `float` scalar.
    F32,
}

/// One kernel parameter: its name (as the kernel family's module documents it) and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub kind: ParamKind,
}

impl Param {
    pub const fn f32_ptr(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::F32Ptr,
        }
    }

    pub const fn i32_ptr(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::I32Ptr,
        }
    }

    pub const fn i64(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::I64,
        }
    }

    pub const fn f32(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::F32,
        }
    }
}

/// How a kernel's work maps onto the grid (1-D grids and blocks: only `.x` is used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// One block per row: `grid.x` = the value of parameter `rows` (blocks past it return at
    /// once). The block's threads stride over the row and then cooperate in block reductions
    /// (warp shuffles, shared memory, barriers), so `block.x` must be a multiple of 32, at most
    /// 1024, and every thread of the block must be launched.
    BlockPerRow { rows: &'static str },
    /// A grid-stride loop over `items` work items (see [`Items`]): any `grid.x` and `block.x`;
    /// threads never cooperate, so every thread's work is independent of the launch shape.
    GridStride { items: Items },
}

/// A work-item count: the product of the named integer parameters, divided by `divisor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Items {
    pub product_of: &'static [&'static str],
    pub divisor: u64,
}

/// One kernel: entry point, parameters in order, launch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    /// The `.visible .entry` symbol in the PTX (and the host emulation's function).
    pub name: &'static str,
    pub params: &'static [Param],
    pub grid: Grid,
}

/// A 1-D launch shape: `grid.x` blocks of `block.x` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    pub grid: u32,
    pub block: u32,
}

/// Threads per block of the default launch of a [`Grid::BlockPerRow`] kernel (four warps).
pub const ROW_BLOCK: u32 = 128;
/// Threads per block of the default launch of a [`Grid::GridStride`] kernel.
pub const STRIDE_BLOCK: u32 = 256;
/// Most blocks the default launch of a grid-stride kernel uses (the loop covers the rest).
pub const MAX_STRIDE_GRID: u64 = 65_535;

impl KernelSpec {
    /// The index of parameter `name`; a name the spec lacks is a bug in the table.
    pub fn param_index(&self, name: &str) -> usize {
        self.params
            .iter()
            .position(|param| param.name == name)
            .unwrap_or_else(|| panic!("bug: {} has no parameter {name}", self.name))
    }

    /// A launch shape that covers the work, given the value of each integer parameter by name:
    /// [`ROW_BLOCK`] threads per row for row kernels; [`STRIDE_BLOCK`]-thread blocks, enough to
    /// give each work item a thread (at most [`MAX_STRIDE_GRID`] blocks), for grid-stride ones.
    pub fn default_launch(&self, value_of: impl Fn(&str) -> u64) -> LaunchShape {
        match self.grid {
            Grid::BlockPerRow { rows } => LaunchShape {
                grid: u32::try_from(value_of(rows).max(1)).expect("more rows than a grid holds"),
                block: ROW_BLOCK,
            },
            Grid::GridStride { items } => {
                let count = items.count(value_of);
                let blocks = count
                    .div_ceil(u64::from(STRIDE_BLOCK))
                    .clamp(1, MAX_STRIDE_GRID);
                LaunchShape {
                    grid: blocks as u32,
                    block: STRIDE_BLOCK,
                }
            }
        }
    }
}

impl Items {
    /// The number of work items, given the integer parameters' values by name.
    pub fn count(&self, value_of: impl Fn(&str) -> u64) -> u64 {
        self.product_of
            .iter()
            .map(|name| value_of(name))
            .product::<u64>()
            / self.divisor
    }
}
