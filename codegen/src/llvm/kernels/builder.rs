//! `KernelBuilder`: the few shapes every kernel is made of, over inkwell's IR builder.
//!
//! A kernel is declared from its [`KernelSpec`] and built for one [`Target`]:
//! - [`Target::Nvptx`]: an NVPTX entry point (`ptx_kernel` calling convention) whose pointer
//!   parameters live in the global address space; thread and block indices are the special
//!   registers, reductions use warp shuffles, shared memory and `bar.sync`.
//! - [`Target::Host`]: the same body as a host function `void kernel(const u64 *args, const
//!   ThreadContext *thread)` for the host emulation ([`super::host`]): the parameters arrive as
//!   8-byte slots (as `cuLaunchKernel`'s argument array), and every GPU-only operation reads
//!   the per-thread context the launcher fills instead: the indices and sizes, the block's
//!   shared memory, and callbacks for the barrier and the butterfly shuffle. `exp`/`ln` use
//!   LLVM's `exp2`/`log2` where the GPU uses `ex2.approx`/`lg2.approx`.
//!
//! Loops keep their counter and accumulators in allocas; the `default<O3>` pipeline that
//! [`super::super::ptx`] runs before code generation promotes them to registers, which keeps the
//! kernels' source free of phi bookkeeping.
//!
//! Two loop shapes cover the kernels:
//! - a *row loop* (`for c = tid.x; c < n; c += ntid.x`): one block per row, every thread of the
//!   block strides over the row, then [`KernelBuilder::block_reduce`] combines the threads' values;
//! - a *grid-stride loop* over a flat index space, for elementwise kernels.
//!
//! Block reductions shuffle within each warp (`shfl.sync.bfly`), write one partial per warp to
//! shared memory, and let every thread fold the partials in warp order, so every thread gets the
//! same bit-identical result. They need a block size that is a multiple of 32 (at most 1024) and
//! every thread of the block to reach them.

use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

use super::host::ContextField;
use super::spec::{KernelSpec, ParamKind};
use crate::CodegenError;

/// LLVM's calling convention number for an NVPTX kernel entry point (`ptx_kernel`).
const PTX_KERNEL_CALLING_CONVENTION: u32 = 71;
/// NVPTX's global address space: where kernel buffers live.
const GLOBAL: u16 = 1;
/// NVPTX's shared (per-block) address space: where reductions keep their per-warp partials.
const SHARED: u16 = 3;
/// Most warps a block can hold (1024 threads): the floats of a reduction's shared memory.
pub(crate) const MAX_WARPS: u32 = 32;

pub(crate) type Result<T> = std::result::Result<T, CodegenError>;

/// What a kernel is built for; see the module comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Nvptx,
    Host,
}

/// How a block reduction combines values.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Combine {
    Sum,
    Max,
}

/// Builds one kernel's body; see the module comment.
pub(crate) struct KernelBuilder<'ctx, 'm> {
    pub context: &'ctx Context,
    module: &'m Module<'ctx>,
    pub builder: Builder<'ctx>,
    function: FunctionValue<'ctx>,
    target: Target,
    spec: &'static KernelSpec,
    /// The kernel's parameters in the spec's order (on the host, loaded from the argument slots).
    params: Vec<BasicValueEnum<'ctx>>,
    /// Shared memory for one partial per warp, created by the kernel's first reduction.
    partials: Option<PointerValue<'ctx>>,
}

fn builder_error(error: inkwell::builder::BuilderError) -> CodegenError {
    CodegenError::Llvm {
        stage: "kernel builder",
        message: error.to_string(),
    }
}

trait OrCodegen<T> {
    fn or_codegen(self) -> Result<T>;
}

impl<T> OrCodegen<T> for std::result::Result<T, inkwell::builder::BuilderError> {
    fn or_codegen(self) -> Result<T> {
        self.map_err(builder_error)
    }
}

impl<'ctx, 'm> KernelBuilder<'ctx, 'm> {
    /// Declares the kernel of `spec` for `target` in `module` and positions at its entry block.
    pub fn new(
        context: &'ctx Context,
        module: &'m Module<'ctx>,
        target: Target,
        spec: &'static KernelSpec,
    ) -> Result<Self> {
        let builder = context.create_builder();
        let (function, params) = match target {
            Target::Nvptx => {
                let global_ptr = context.ptr_type(AddressSpace::from(GLOBAL));
                let param_types: Vec<BasicMetadataTypeEnum> = spec
                    .params
                    .iter()
                    .map(|param| match param.kind {
                        ParamKind::F32Ptr | ParamKind::I32Ptr => global_ptr.into(),
                        ParamKind::I64 => context.i64_type().into(),
                        ParamKind::F32 => context.f32_type().into(),
                    })
                    .collect();
                let function_type = context.void_type().fn_type(&param_types, false);
                let function = module.add_function(spec.name, function_type, None);
                function.set_call_conventions(PTX_KERNEL_CALLING_CONVENTION);
                builder.position_at_end(context.append_basic_block(function, "entry"));
                (function, function.get_params())
            }
            Target::Host => {
                let ptr = context.ptr_type(AddressSpace::default());
                let function_type = context
                    .void_type()
                    .fn_type(&[ptr.into(), ptr.into()], false);
                let function = module.add_function(spec.name, function_type, None);
                builder.position_at_end(context.append_basic_block(function, "entry"));
                let params = Self::load_host_params(context, &builder, function, spec)?;
                (function, params)
            }
        };
        let mut kernel = KernelBuilder {
            context,
            module,
            builder,
            function,
            target,
            spec,
            params,
            partials: None,
        };
        if target == Target::Host {
            let ptr_type = context.ptr_type(AddressSpace::default()).into();
            let shared = kernel.host_context_field(ContextField::SharedMemory, ptr_type)?;
            kernel.partials = Some(shared.into_pointer_value());
        }
        Ok(kernel)
    }

    /// The host kernel's parameters, loaded from its argument slots (8 bytes each; a float in
    /// the slot's first 4 bytes).
    fn load_host_params(
        context: &'ctx Context,
        builder: &Builder<'ctx>,
        function: FunctionValue<'ctx>,
        spec: &KernelSpec,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let slots = function
            .get_nth_param(0)
            .expect("bug: host kernels take their argument slots first")
            .into_pointer_value();
        let mut params = Vec::with_capacity(spec.params.len());
        for (index, param) in spec.params.iter().enumerate() {
            let slot_index = context.i64_type().const_int(index as u64, false);
            // SAFETY: the launcher passes one slot per parameter of the spec.
            let slot = unsafe {
                builder
                    .build_in_bounds_gep(context.i64_type(), slots, &[slot_index], param.name)
                    .or_codegen()?
            };
            let value_type: BasicTypeEnum = match param.kind {
                ParamKind::F32Ptr | ParamKind::I32Ptr => {
                    context.ptr_type(AddressSpace::default()).into()
                }
                ParamKind::I64 => context.i64_type().into(),
                ParamKind::F32 => context.f32_type().into(),
            };
            params.push(
                builder
                    .build_load(value_type, slot, param.name)
                    .or_codegen()?,
            );
        }
        Ok(params)
    }

    /// Pointer parameter `name`.
    pub fn ptr(&self, name: &str) -> PointerValue<'ctx> {
        self.param(name).into_pointer_value()
    }

    /// Integer parameter `name`.
    pub fn int(&self, name: &str) -> IntValue<'ctx> {
        self.param(name).into_int_value()
    }

    /// Float parameter `name`.
    pub fn float(&self, name: &str) -> FloatValue<'ctx> {
        self.param(name).into_float_value()
    }

    fn param(&self, name: &str) -> BasicValueEnum<'ctx> {
        self.params[self.spec.param_index(name)]
    }

    /// Ends the kernel.
    pub fn finish(self) -> Result<()> {
        self.builder.build_return(None).or_codegen()?;
        Ok(())
    }

    // ---- intrinsics ----

    fn call_intrinsic(
        &self,
        name: &str,
        overload: &[BasicTypeEnum<'ctx>],
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        let missing = || CodegenError::Llvm {
            stage: "kernel builder",
            message: format!("LLVM has no intrinsic {name}"),
        };
        let intrinsic = Intrinsic::find(name).ok_or_else(missing)?;
        let declaration = intrinsic
            .get_declaration(self.module, overload)
            .ok_or_else(missing)?;
        let call = self
            .builder
            .build_call(declaration, args, "")
            .or_codegen()?;
        Ok(call.try_as_basic_value().basic())
    }

    /// Calls a float intrinsic overloaded on f32 with one argument.
    fn call_f32_intrinsic(&self, name: &str, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let f32_type = self.context.f32_type().into();
        Ok(self
            .call_intrinsic(name, &[f32_type], &[x.into()])?
            .unwrap_or_else(|| panic!("bug: {name} returns a value"))
            .into_float_value())
    }

    /// The host thread context (the host kernel's second parameter).
    fn host_context(&self) -> PointerValue<'ctx> {
        self.function
            .get_nth_param(1)
            .expect("bug: host kernels take their thread context second")
            .into_pointer_value()
    }

    /// Loads field `field` (8 bytes) of the host thread context as `value_type`.
    fn host_context_field(
        &self,
        field: ContextField,
        value_type: BasicTypeEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let index = self.i64(field as u64);
        // SAFETY: `ContextField` numbers the 8-byte fields of the launcher's `ThreadContext`.
        let address = unsafe {
            self.builder
                .build_in_bounds_gep(self.context.i64_type(), self.host_context(), &[index], "")
                .or_codegen()?
        };
        self.builder
            .build_load(value_type, address, "")
            .or_codegen()
    }

    /// A special register (`tid.x`, `ntid.x`, `ctaid.x`, `nctaid.x`) widened to i64, or on the
    /// host the context field the launcher fills with it.
    fn special_register(&self, register: &str, field: ContextField) -> Result<IntValue<'ctx>> {
        if self.target == Target::Host {
            let i64_type = self.context.i64_type().into();
            return Ok(self.host_context_field(field, i64_type)?.into_int_value());
        }
        let name = format!("llvm.nvvm.read.ptx.sreg.{register}");
        let value = self
            .call_intrinsic(&name, &[], &[])?
            .expect("bug: special registers return a value")
            .into_int_value();
        self.builder
            .build_int_z_extend(value, self.context.i64_type(), register)
            .or_codegen()
    }

    pub fn thread_index(&self) -> Result<IntValue<'ctx>> {
        self.special_register("tid.x", ContextField::Thread)
    }

    pub fn block_size(&self) -> Result<IntValue<'ctx>> {
        self.special_register("ntid.x", ContextField::BlockSize)
    }

    pub fn block_index(&self) -> Result<IntValue<'ctx>> {
        self.special_register("ctaid.x", ContextField::Block)
    }

    fn grid_size(&self) -> Result<IntValue<'ctx>> {
        self.special_register("nctaid.x", ContextField::Grid)
    }

    /// Calls the host context's callback in `field` with the context and `args`.
    fn call_host_callback(
        &self,
        field: ContextField,
        returns: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        let ptr_type = self.context.ptr_type(AddressSpace::default());
        let callback = self
            .host_context_field(field, ptr_type.into())?
            .into_pointer_value();
        let mut all_args: Vec<BasicMetadataValueEnum> = vec![self.host_context().into()];
        all_args.extend_from_slice(args);
        let arg_types: Vec<BasicMetadataTypeEnum> = all_args
            .iter()
            .map(|arg| match arg {
                BasicMetadataValueEnum::PointerValue(_) => ptr_type.into(),
                BasicMetadataValueEnum::FloatValue(_) => self.context.f32_type().into(),
                _ => self.context.i32_type().into(),
            })
            .collect();
        let function_type = match returns {
            Some(value_type) => value_type.fn_type(&arg_types, false),
            None => self.context.void_type().fn_type(&arg_types, false),
        };
        let call = self
            .builder
            .build_indirect_call(function_type, callback, &all_args, "")
            .or_codegen()?;
        Ok(call.try_as_basic_value().basic())
    }

    fn barrier(&self) -> Result<()> {
        if self.target == Target::Host {
            self.call_host_callback(ContextField::Barrier, None, &[])?;
            return Ok(());
        }
        let zero = self.context.i32_type().const_zero();
        self.call_intrinsic(
            "llvm.nvvm.barrier.cta.sync.aligned.all",
            &[],
            &[zero.into()],
        )?;
        Ok(())
    }

    /// The value of the lane `lane ^ lane_mask` of the warp (`shfl.sync.bfly`, full warp).
    fn shuffle_butterfly(
        &self,
        value: FloatValue<'ctx>,
        lane_mask: u64,
    ) -> Result<FloatValue<'ctx>> {
        let i32_type = self.context.i32_type();
        let lane_mask = i32_type.const_int(lane_mask, false);
        let result = if self.target == Target::Host {
            let f32_type = self.context.f32_type().into();
            self.call_host_callback(
                ContextField::Shuffle,
                Some(f32_type),
                &[value.into(), lane_mask.into()],
            )?
        } else {
            self.call_intrinsic(
                "llvm.nvvm.shfl.sync.bfly.f32",
                &[],
                &[
                    i32_type.const_all_ones().into(),
                    value.into(),
                    lane_mask.into(),
                    i32_type.const_int(31, false).into(),
                ],
            )?
        };
        Ok(result
            .expect("bug: shuffles return a value")
            .into_float_value())
    }

    /// `exp(x)` as `2^(x · log2 e)`: on the GPU `ex2.approx` (relative error about 2⁻²²),
    /// since NVPTX has no exact exponential without libdevice; on the host LLVM's `exp2`.
    pub fn exp(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let log2_e = self.f32(std::f32::consts::LOG2_E);
        let scaled = self.fmul(x, log2_e)?;
        match self.target {
            Target::Nvptx => self.call_f32_intrinsic("llvm.nvvm.ex2.approx", scaled),
            Target::Host => self.call_f32_intrinsic("llvm.exp2", scaled),
        }
    }

    /// `ln(x)` as `log2(x) · ln 2`: `lg2.approx` on the GPU, LLVM's `log2` on the host.
    pub fn ln(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let log2 = match self.target {
            Target::Nvptx => self
                .call_intrinsic("llvm.nvvm.lg2.approx.f", &[], &[x.into()])?
                .expect("bug: lg2 returns a value")
                .into_float_value(),
            Target::Host => self.call_f32_intrinsic("llvm.log2", x)?,
        };
        self.fmul(log2, self.f32(std::f32::consts::LN_2))
    }

    /// IEEE square root (`sqrt.rn.f32`).
    pub fn sqrt(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let f32_type = self.context.f32_type().into();
        Ok(self
            .call_intrinsic("llvm.sqrt", &[f32_type], &[x.into()])?
            .expect("bug: sqrt returns a value")
            .into_float_value())
    }

    // ---- arithmetic ----

    pub fn f32(&self, value: f32) -> FloatValue<'ctx> {
        self.context.f32_type().const_float(f64::from(value))
    }

    pub fn i64(&self, value: u64) -> IntValue<'ctx> {
        self.context.i64_type().const_int(value, false)
    }

    pub fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder.build_float_add(a, b, "").or_codegen()
    }

    pub fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder.build_float_sub(a, b, "").or_codegen()
    }

    pub fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder.build_float_mul(a, b, "").or_codegen()
    }

    pub fn fdiv(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder.build_float_div(a, b, "").or_codegen()
    }

    pub fn fneg(&self, a: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder.build_float_neg(a, "").or_codegen()
    }

    /// `1 / (1 + exp(-x))`.
    pub fn sigmoid(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let exp_neg = self.exp(self.fneg(x)?)?;
        let one = self.f32(1.0);
        self.fdiv(one, self.fadd(one, exp_neg)?)
    }

    pub fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder.build_int_add(a, b, "").or_codegen()
    }

    pub fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder.build_int_sub(a, b, "").or_codegen()
    }

    /// Unsigned minimum.
    pub fn umin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let a_smaller = self.unsigned_less(a, b)?;
        Ok(self
            .builder
            .build_select(a_smaller, a, b, "")
            .or_codegen()?
            .into_int_value())
    }

    pub fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder.build_int_mul(a, b, "").or_codegen()
    }

    /// Unsigned division and remainder: `(a / b, a % b)`.
    pub fn divrem(
        &self,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let quotient = self.builder.build_int_unsigned_div(a, b, "").or_codegen()?;
        let remainder = self.builder.build_int_unsigned_rem(a, b, "").or_codegen()?;
        Ok((quotient, remainder))
    }

    pub fn select_f32(
        &self,
        condition: IntValue<'ctx>,
        then: FloatValue<'ctx>,
        otherwise: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        Ok(self
            .builder
            .build_select(condition, then, otherwise, "")
            .or_codegen()?
            .into_float_value())
    }

    pub fn int_eq(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder
            .build_int_compare(IntPredicate::EQ, a, b, "")
            .or_codegen()
    }

    pub fn and(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder.build_and(a, b, "").or_codegen()
    }

    pub fn not(&self, a: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder.build_not(a, "").or_codegen()
    }

    /// Signed `a >= 0`.
    pub fn non_negative(&self, a: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let zero = a.get_type().const_zero();
        self.builder
            .build_int_compare(IntPredicate::SGE, a, zero, "")
            .or_codegen()
    }

    pub fn combine(
        &self,
        combine: Combine,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        match combine {
            Combine::Sum => self.fadd(a, b),
            Combine::Max => {
                let greater = self
                    .builder
                    .build_float_compare(FloatPredicate::OGT, a, b, "")
                    .or_codegen()?;
                self.select_f32(greater, a, b)
            }
        }
    }

    // ---- memory ----

    fn element(
        &self,
        base: PointerValue<'ctx>,
        element_type: BasicTypeEnum<'ctx>,
        index: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        // SAFETY: the kernels index their buffers within the sizes the caller passes (each
        // kernel's contract in its module states the buffer sizes it needs).
        unsafe {
            self.builder
                .build_in_bounds_gep(element_type, base, &[index], "")
                .or_codegen()
        }
    }

    pub fn load_f32(
        &self,
        base: PointerValue<'ctx>,
        index: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let f32_type = self.context.f32_type();
        let address = self.element(base, f32_type.into(), index)?;
        Ok(self
            .builder
            .build_load(f32_type, address, "")
            .or_codegen()?
            .into_float_value())
    }

    /// Loads an i32 and sign-extends it to i64.
    pub fn load_i32(
        &self,
        base: PointerValue<'ctx>,
        index: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let i32_type = self.context.i32_type();
        let address = self.element(base, i32_type.into(), index)?;
        let value = self
            .builder
            .build_load(i32_type, address, "")
            .or_codegen()?
            .into_int_value();
        self.builder
            .build_int_s_extend(value, self.context.i64_type(), "")
            .or_codegen()
    }

    pub fn store_f32(
        &self,
        base: PointerValue<'ctx>,
        index: IntValue<'ctx>,
        value: FloatValue<'ctx>,
    ) -> Result<()> {
        let address = self.element(base, self.context.f32_type().into(), index)?;
        self.builder.build_store(address, value).or_codegen()?;
        Ok(())
    }

    // ---- variables and control flow ----

    /// A mutable f32 or f64 local, promoted to a register by the optimiser.
    pub fn local(&self, initial: FloatValue<'ctx>) -> Result<PointerValue<'ctx>> {
        let slot = self.entry_alloca(initial.get_type().into())?;
        self.builder.build_store(slot, initial).or_codegen()?;
        Ok(slot)
    }

    pub fn read(
        &self,
        local: PointerValue<'ctx>,
        like: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        Ok(self
            .builder
            .build_load(like.get_type(), local, "")
            .or_codegen()?
            .into_float_value())
    }

    pub fn write(&self, local: PointerValue<'ctx>, value: FloatValue<'ctx>) -> Result<()> {
        self.builder.build_store(local, value).or_codegen()?;
        Ok(())
    }

    /// A per-thread array of `len` floats (local memory on the GPU), in the entry block.
    pub fn f32_array(&self, len: u32) -> Result<PointerValue<'ctx>> {
        self.entry_alloca(self.context.f32_type().array_type(len).into())
    }

    /// A mutable i64 local, promoted to a register by the optimiser.
    pub fn int_local(&self, initial: IntValue<'ctx>) -> Result<PointerValue<'ctx>> {
        let slot = self.entry_alloca(self.context.i64_type().into())?;
        self.builder.build_store(slot, initial).or_codegen()?;
        Ok(slot)
    }

    pub fn read_int(&self, local: PointerValue<'ctx>) -> Result<IntValue<'ctx>> {
        Ok(self
            .builder
            .build_load(self.context.i64_type(), local, "")
            .or_codegen()?
            .into_int_value())
    }

    pub fn write_int(&self, local: PointerValue<'ctx>, value: IntValue<'ctx>) -> Result<()> {
        self.builder.build_store(local, value).or_codegen()?;
        Ok(())
    }

    /// A stack slot in the entry block, where the optimiser's mem2reg finds it (an alloca inside a
    /// loop would be a fresh slot per iteration and stay in memory).
    fn entry_alloca(&self, slot_type: BasicTypeEnum<'ctx>) -> Result<PointerValue<'ctx>> {
        let entry = self
            .function
            .get_first_basic_block()
            .expect("bug: kernels have an entry block");
        let at_entry = self.context.create_builder();
        match entry.get_first_instruction() {
            Some(first) => at_entry.position_before(&first),
            None => at_entry.position_at_end(entry),
        }
        at_entry.build_alloca(slot_type, "").or_codegen()
    }

    /// A count as f32 (for means over a row).
    pub fn count_to_f32(&self, count: IntValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder
            .build_unsigned_int_to_float(count, self.context.f32_type(), "")
            .or_codegen()
    }

    /// Widens an f32 to f64 (for sums over many rows).
    pub fn to_f64(&self, value: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder
            .build_float_ext(value, self.context.f64_type(), "")
            .or_codegen()
    }

    pub fn to_f32(&self, value: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.builder
            .build_float_trunc(value, self.context.f32_type(), "")
            .or_codegen()
    }

    /// `for i = start; i < end; i += step { body(i) }` over unsigned i64.
    pub fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        body: impl FnOnce(&Self, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let i64_type = self.context.i64_type();
        let counter = self.entry_alloca(i64_type.into())?;
        self.builder.build_store(counter, start).or_codegen()?;
        let condition_block = self.context.append_basic_block(self.function, "loop.cond");
        let body_block = self.context.append_basic_block(self.function, "loop.body");
        let exit_block = self.context.append_basic_block(self.function, "loop.exit");
        self.builder
            .build_unconditional_branch(condition_block)
            .or_codegen()?;

        self.builder.position_at_end(condition_block);
        let index = self
            .builder
            .build_load(i64_type, counter, "")
            .or_codegen()?
            .into_int_value();
        let in_range = self
            .builder
            .build_int_compare(IntPredicate::ULT, index, end, "")
            .or_codegen()?;
        self.builder
            .build_conditional_branch(in_range, body_block, exit_block)
            .or_codegen()?;

        self.builder.position_at_end(body_block);
        body(self, index)?;
        let next = self.add(index, step)?;
        self.builder.build_store(counter, next).or_codegen()?;
        self.builder
            .build_unconditional_branch(condition_block)
            .or_codegen()?;

        self.builder.position_at_end(exit_block);
        Ok(())
    }

    /// `body(i)` for `i = tid.x, tid.x + ntid.x, ... < n`: the block's threads stride over a row.
    pub fn row_loop(
        &self,
        n: IntValue<'ctx>,
        body: impl FnOnce(&Self, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        self.for_range(self.thread_index()?, n, self.block_size()?, body)
    }

    /// `body(i)` for every `i < n`, spread over the whole grid.
    pub fn grid_stride_loop(
        &self,
        n: IntValue<'ctx>,
        body: impl FnOnce(&Self, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let block_size = self.block_size()?;
        let first = self.add(
            self.mul(self.block_index()?, block_size)?,
            self.thread_index()?,
        )?;
        let stride = self.mul(self.grid_size()?, block_size)?;
        self.for_range(first, n, stride, body)
    }

    /// Runs `body` only where `condition` holds.
    pub fn when(
        &self,
        condition: IntValue<'ctx>,
        body: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<()> {
        let then_block = self.context.append_basic_block(self.function, "then");
        let join_block = self.context.append_basic_block(self.function, "join");
        self.builder
            .build_conditional_branch(condition, then_block, join_block)
            .or_codegen()?;
        self.builder.position_at_end(then_block);
        body(self)?;
        self.builder
            .build_unconditional_branch(join_block)
            .or_codegen()?;
        self.builder.position_at_end(join_block);
        Ok(())
    }

    /// Returns from the kernel unless `condition` holds (a block-uniform guard such as
    /// `ctaid.x < rows`, so reductions after it still see the whole block).
    pub fn return_unless(&self, condition: IntValue<'ctx>) -> Result<()> {
        let go_on = self.context.append_basic_block(self.function, "body");
        let leave = self.context.append_basic_block(self.function, "leave");
        self.builder
            .build_conditional_branch(condition, go_on, leave)
            .or_codegen()?;
        self.builder.position_at_end(leave);
        self.builder.build_return(None).or_codegen()?;
        self.builder.position_at_end(go_on);
        Ok(())
    }

    pub fn unsigned_less_or_equal(
        &self,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        self.builder
            .build_int_compare(IntPredicate::ULE, a, b, "")
            .or_codegen()
    }

    pub fn unsigned_less(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.builder
            .build_int_compare(IntPredicate::ULT, a, b, "")
            .or_codegen()
    }

    // ---- reductions ----

    /// The block's shared memory for one partial per warp: on the GPU a `.shared` array made by
    /// the kernel's first reduction; on the host, the launcher's per-block buffer (loaded in
    /// [`KernelBuilder::new`], so it dominates every use).
    fn partials(&mut self) -> PointerValue<'ctx> {
        if let Some(partials) = self.partials {
            return partials;
        }
        let array_type = self.context.f32_type().array_type(MAX_WARPS);
        let name = format!("{}.partials", self.function.get_name().to_string_lossy());
        let partials = self
            .module
            .add_global(array_type, Some(AddressSpace::from(SHARED)), &name);
        partials.set_initializer(&array_type.get_undef());
        partials.set_linkage(Linkage::Internal);
        partials.set_alignment(4);
        self.partials = Some(partials.as_pointer_value());
        partials.as_pointer_value()
    }

    /// Combines `value` over the whole block; every thread gets the result.
    pub fn block_reduce(
        &mut self,
        value: FloatValue<'ctx>,
        combine: Combine,
    ) -> Result<FloatValue<'ctx>> {
        let mut reduced = value;
        for lane_mask in [16, 8, 4, 2, 1] {
            let other = self.shuffle_butterfly(reduced, lane_mask)?;
            reduced = self.combine(combine, reduced, other)?;
        }

        let partials = self.partials();
        let thread = self.thread_index()?;
        let (warp, lane) = self.divrem(thread, self.i64(32))?;
        self.when(self.int_eq(lane, self.i64(0))?, |kb| {
            kb.store_f32(partials, warp, reduced)
        })?;
        self.barrier()?;

        let warps = self.divrem(self.block_size()?, self.i64(32))?.0;
        let first = self.load_f32(partials, self.i64(0))?;
        let total = self.local(first)?;
        self.for_range(self.i64(1), warps, self.i64(1), |kb, w| {
            let partial = kb.load_f32(partials, w)?;
            let sum = kb.combine(combine, kb.read(total, first)?, partial)?;
            kb.write(total, sum)
        })?;
        let result = self.read(total, first)?;
        // The partials are reused by the next reduction: nobody may overwrite them before
        // every thread has read them.
        self.barrier()?;
        Ok(result)
    }
}
