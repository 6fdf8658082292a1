//! clusterfuse's procedural macros (`#[kernel]`, `#[cluster_primitive]`, `shared!`). Use them
//! through the `clusterfuse` crate.
//!
//! Each macro parses into a small model that keeps the user's tokens and spans
//! (`kernel/ast.rs`), checks it against Hopper's limits (`kernel/valid.rs`), and emits code
//! (`kernel/expand.rs`); nothing both parses and emits.

mod cluster_primitive;
mod kernel;
mod shared;

use proc_macro::TokenStream;

/// Marks a function as a GPU kernel.
///
/// On `nvptx64` it becomes an `extern "ptx-kernel"` entry with its launch bounds and cluster
/// shape carried into the PTX; on the host it becomes a module of the same name holding a
/// typed launcher (`load`, then `launch`). Parameters: scalars (`f32`, `u32`, `f16`, ... or
/// any `DeviceCopy` type), inputs `&[T]`, outputs `Out<T>`.
///
/// ```ignore
/// #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
/// pub fn saxpy(a: f32, x: &[f32], y: Out<f32>) { ... }
/// ```
///
/// Arguments: `launch_bounds(max_threads = N[, min_blocks = M])`,
/// `cluster(X[, Y[, Z]][, non_portable])`, `crate = path`.
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

/// A statically sized shared-memory array, one per call site and block:
/// `let tile = shared!([f32; 256]);` gives a `SharedSlice<f32>` of 256 elements.
#[proc_macro]
pub fn shared(input: TokenStream) -> TokenStream {
    shared::expand(input.into()).into()
}
