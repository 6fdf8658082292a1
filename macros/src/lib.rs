//! clusterfuse's procedural macros (`#[kernel]`, `#[fused_kernel]`, `#[cluster_primitive]`,
//! `shared!`). Use them through the `clusterfuse` crate.
//!
//! Each macro parses into a small model that keeps the user's tokens and spans
//! (`kernel/ast.rs`), checks it against Hopper's limits (`kernel/valid.rs`), and emits code
//! (`kernel/expand.rs`); nothing both parses and emits.

mod cluster_primitive;
mod fused;
mod kernel;
mod shared;

use proc_macro::TokenStream;

/// Marks a function as a GPU kernel.
///
/// On `nvptx64` it becomes an `extern "ptx-kernel"` entry with its launch bounds and cluster
/// shape carried into the PTX; on the host it becomes a module of the same name holding a
/// typed launcher (`load`, then `launch`). Parameters (plain names, `mut` allowed): scalars
/// (`f32`, `u32`, `f16`, ... or any `DeviceCopy` type), inputs `&[T]`, outputs `Out<T>`,
/// published buffers `Published<T>` (persistent kernels).
///
/// ```ignore
/// #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
/// pub fn saxpy(a: f32, x: &[f32], y: Out<f32>) { ... }
/// ```
///
/// Arguments: `launch_bounds(max_threads = N[, min_blocks = M])`,
/// `cluster(X[, Y[, Z]][, non_portable])`, `persistent` (blocks wait on each other through
/// `Published` buffers: every launch checks that the whole grid is resident; a kernel with
/// such a buffer waits for the kernel it was launched programmatically after as it starts, so
/// it may follow any kernel, itself included, under programmatic dependent launch), `crate = path`.
#[proc_macro_attribute]
pub fn kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand(args.into(), item.into()).into()
}

/// Marks a user-written cluster collective (see `cluster_primitive.rs` for what it checks).
///
/// ```ignore
/// #[cluster_primitive(shared(scratch: [u64; 48]), barriers = 2)]
/// pub fn argmax(scope: &cluster::Cluster, data: SharedSlice<f32>) -> (f32, u32) { ... }
/// ```
///
/// The function must take the scope token `&Cluster` first. `shared(name: [T; N])` binds
/// `name: SharedSlice<T>` to a static shared array of the primitive (concrete type, no generic
/// parameters); `barriers = N` (required) declares the cluster barriers per call. Both land in
/// `<name>::FACTS`. Arguments: `shared(..)`, `barriers = N`, `crate = path`.
#[proc_macro_attribute]
pub fn cluster_primitive(args: TokenStream, item: TokenStream) -> TokenStream {
    cluster_primitive::expand(args.into(), item.into()).into()
}

/// Composes stages into one kernel, checking the fusion plan at compile time.
///
/// On an inline module holding `#[stage(scope)]` functions and `pub fn kernel(..)`, whose
/// body is the stages' dataflow (`let row = load(x, b);`). Stage parameters carry where each
/// value lives: `Registers<T>`, `Shared<[T; N]>`, `Dsmem<[T; N]>` (peers' shared memory),
/// `Global<&[T]>`, `Global<Out<T>>`, or nothing for a launch argument; `#[out]` marks the
/// shared arrays a stage writes (the kernel allocates them). The markers are erased: stages
/// see `T`, `SharedSlice<T>`, `&[T]` and `&Out<T>`. The module gets a `#[kernel]` named after
/// it, so `name::load(&gpu)?.launch(stream, &name::config(rows), ..)`.
///
/// ```ignore
/// #[fused_kernel(grid = rows, block = 128)]
/// pub mod scale_rows {
///     use clusterfuse::prelude::*;
///     #[stage(block)]
///     fn load(x: Global<&[f32]>) -> Registers<f32> { .. }
///     #[stage(thread)]
///     fn store(v: Registers<f32>, out: Global<Out<f32>>) { .. }
///     pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
///         let v = load(x);
///         store(v, out);
///     }
/// }
/// ```
///
/// Arguments: `grid = expr` (blocks; literals, module `const`s and `u32` parameters),
/// `block = N`, `cluster(X[, Y[, Z]][, non_portable])`, `launch_bounds(..)` (default:
/// `max_threads = block`), `dynamic_smem = BYTES`, `crate = path`.
#[proc_macro_attribute]
pub fn fused_kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    fused::expand(args.into(), item.into()).into()
}

/// Marks a stage of a `#[fused_kernel]` module; that macro consumes it. Anywhere else it is
/// an error.
#[proc_macro_attribute]
pub fn stage(_args: TokenStream, item: TokenStream) -> TokenStream {
    let err = syn::Error::new(
        proc_macro2::Span::call_site(),
        "`#[stage]` only marks a function inside a `#[fused_kernel(..)] mod`; put it there or drop it",
    )
    .to_compile_error();
    let item: proc_macro2::TokenStream = item.into();
    quote::quote!(#err #item).into()
}

/// What the facade's `shared!([T; N])` expands to, as `shared_array!($crate; [T; N])`: a
/// statically sized shared-memory array, one per call site and block.
#[doc(hidden)]
#[proc_macro]
pub fn shared_array(input: TokenStream) -> TokenStream {
    shared::expand(input.into()).into()
}
