//! Code generation for `#[kernel]`: the PTX entry (nvptx64) and the typed launcher (host),
//! both from the same parsed model so they cannot disagree.

use super::ast::{Kernel, ParamKind};
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

/// The user's item next to the errors, so one mistake does not
/// cascade into errors about a missing kernel.
pub fn fallback(item: TokenStream, err: syn::Error) -> TokenStream {
    let err = err.to_compile_error();
    quote! {
        #err
        #[allow(dead_code)]
        #item
    }
}

pub fn kernel(kernel: &Kernel) -> TokenStream {
    let device = device_entry(kernel);
    let host = host_launcher(kernel);
    let item = &kernel.item;
    // On the host the function stays an ordinary (uncalled) function, so that its body and
    // the crate's device imports type-check there too.
    quote! {
        #device
        #host
        #[cfg(not(target_arch = "nvptx64"))]
        #[allow(dead_code)]
        #item
    }
}

fn krate(kernel: &Kernel) -> TokenStream {
    match &kernel.krate {
        Some(path) => quote!(#path),
        None => quote!(::clusterfuse),
    }
}

/// The facts line the build helper reads back from the PTX to insert `.maxntid`,
/// `.minnctapersm`, `.reqnctapercluster` and `.explicitcluster` into the entry.
fn facts_comment(kernel: &Kernel) -> String {
    let mut line = format!("// clusterfuse-kernel name={}", kernel.item.sig.ident);
    if let Some(bounds) = &kernel.launch_bounds {
        line += &format!(" maxntid={}", bounds.max_threads.value);
        if let Some(min) = bounds.min_blocks {
            line += &format!(" minnctapersm={}", min.value);
        }
    }
    if let Some(cluster) = &kernel.cluster {
        let [x, y, z] = cluster.dims;
        line += &format!(" reqnctapercluster={x},{y},{z}");
    }
    line
}

fn device_entry(kernel: &Kernel) -> TokenStream {
    let krate = krate(kernel);
    let item = &kernel.item;
    let attrs = &item.attrs;
    let vis = &item.vis;
    let name = &item.sig.ident;
    let body = &item.block;
    let facts = facts_comment(kernel);
    let mut params = Vec::new();
    let mut bindings = Vec::new();
    // With published buffers the body is a function taking the parameters as written (below);
    // otherwise the entry's own bindings carry their `mut`.
    let published = kernel.params.iter().any(|p| matches!(p.kind, ParamKind::Published(_)));
    for param in &kernel.params {
        let ident = &param.ident;
        let ty = &param.ty;
        let mutability = param.mutability.filter(|_| !published);
        let ptr = format_ident!("{}__ptr", ident);
        let len = format_ident!("{}__len", ident);
        match &param.kind {
            ParamKind::Scalar => params.push(quote!(#mutability #ident: #ty)),
            ParamKind::Input(elem) => {
                params.push(quote!(#ptr: *const #elem, #len: usize));
                bindings.push(quote_spanned! {ty.span()=>
                    // SAFETY: the host launcher passes a live device buffer's pointer and length.
                    let #mutability #ident: #ty = unsafe { #krate::__private::input_slice(#ptr, #len) };
                });
            }
            ParamKind::Output(elem) => {
                params.push(quote!(#ptr: *mut #elem, #len: usize));
                bindings.push(quote_spanned! {ty.span()=>
                    // SAFETY: the host launcher passes a live, exclusively borrowed device buffer.
                    let #mutability #ident: #ty = unsafe { #krate::__private::Out::from_raw_parts(#ptr, #len) };
                });
            }
            ParamKind::Published(elem) => {
                let (flags, flags_len, tile) = (format_ident!("{}__flags", ident), format_ident!("{}__flags_len", ident), format_ident!("{}__tile", ident));
                params.push(quote!(#ptr: *mut #elem, #len: usize, #flags: *mut u32, #flags_len: usize, #tile: u32));
                bindings.push(quote_spanned! {ty.span()=>
                    // SAFETY: the host launcher passes a live, exclusively borrowed published
                    // buffer; every block retires it after the body (below).
                    let #ident: #ty = unsafe { #krate::__private::published(#ptr, #len, #flags, #flags_len, #tile) };
                });
            }
            ParamKind::Unsupported(_) => unreachable!("rejected by valid::check"),
        }
    }
    // With published buffers the body becomes a function of the parameters, so that every
    // block retires them after it, whatever it returned from (an always-inlined function: a
    // closure's captures would stay in local memory).
    let body = if published {
        let inputs = &item.sig.inputs;
        let names = kernel.params.iter().map(|p| &p.ident);
        let call = with_retirement(kernel, quote!(__kernel_body(#(#names),*)));
        quote!({
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn __kernel_body(#inputs) #body
            #call
        })
    } else {
        quote!(#body)
    };
    quote! {
        #[cfg(target_arch = "nvptx64")]
        ::core::arch::global_asm!(#facts);

        #[cfg(target_arch = "nvptx64")]
        #(#attrs)*
        #[unsafe(no_mangle)]
        #vis extern "ptx-kernel" fn #name(#(#params),*) {
            #(#bindings)*
            #body
        }
    }
}

fn host_launcher(kernel: &Kernel) -> TokenStream {
    let krate = krate(kernel);
    let item = &kernel.item;
    let vis = &item.vis;
    let name = &item.sig.ident;
    let name_str = name.to_string();
    let docs = item.attrs.iter().filter(|attr| attr.path().is_ident("doc"));
    let host = quote!(#krate::__private::host);

    let max_threads = option(kernel.launch_bounds.as_ref().map(|b| b.max_threads.value));
    let min_blocks = option(kernel.launch_bounds.as_ref().and_then(|b| b.min_blocks.map(|m| m.value)));
    let cluster = match &kernel.cluster {
        Some(c) => {
            let [x, y, z] = c.dims;
            quote!(::core::option::Option::Some(#host::Dim3::new(#x, #y, #z)))
        }
        None => quote!(::core::option::Option::None),
    };

    let persistent = kernel.persistent.is_some();
    // The launchers' own names, hygienic: a kernel parameter may be called `stream` or `config`.
    let [stream, config, plan, params, emulated] = ["stream", "config", "plan", "params", "emulated"].map(|name| Ident::new(name, Span::mixed_site()));
    let mut args = Vec::new();
    let mut lowering = Vec::new();
    let mut slots = Vec::new();
    let mut buffers = Vec::new();
    let mut emulated_args = Vec::new();
    let mut views = Vec::new();
    for param in &kernel.params {
        let ident = &param.ident;
        let ty = &param.ty;
        let ptr = format_ident!("{}__ptr", ident);
        let sync = format_ident!("_{}__sync", ident);
        let len = format_ident!("{}__len", ident);
        match &param.kind {
            ParamKind::Scalar => {
                args.push(quote!(#ident: #ty));
                slots.push(quote_spanned!(ty.span()=> #host::param(&#ident)));
                emulated_args.push(quote!(#ident));
            }
            ParamKind::Input(elem) | ParamKind::Output(elem) => {
                let (arg, launch_ptr, view) = match &param.kind {
                    ParamKind::Input(_) => (
                        quote!(&#host::Buffer<#elem>),
                        quote!(launch_ptr),
                        quote!(#krate::__private::input_slice(#ptr as *const #elem, #len)),
                    ),
                    _ => (
                        quote!(&mut #host::Buffer<#elem>),
                        quote!(launch_ptr_mut),
                        quote!(#krate::__private::Out::from_raw_parts(#ptr as *mut #elem, #len)),
                    ),
                };
                args.push(quote!(#ident: #arg));
                lowering.push(quote! {
                    let #len: usize = #ident.len();
                    let (#ptr, #sync) = #ident.#launch_ptr(#stream)?;
                });
                slots.push(quote!(#host::param(&#ptr)));
                slots.push(quote!(#host::param(&#len)));
                let name = ident.to_string();
                buffers.push(quote!((#ptr, #len * ::core::mem::size_of::<#elem>(), #name)));
                emulated_args.push(view);
            }
            ParamKind::Published(elem) => {
                let (flags, flags_len, tile, flags_sync) =
                    (format_ident!("{}__flags", ident), format_ident!("{}__flags_len", ident), format_ident!("{}__tile", ident), format_ident!("_{}__flags_sync", ident));
                args.push(quote!(#ident: &mut #host::Published<#elem>));
                lowering.push(quote! {
                    let #tile: u32 = #ident.tile();
                    let (#ident, #flags) = #ident.parts_mut();
                    let (#len, #flags_len): (usize, usize) = (#ident.len(), #flags.len());
                    let (#ptr, #sync) = #ident.launch_ptr_mut(#stream)?;
                    let (#flags, #flags_sync) = #flags.launch_ptr_mut(#stream)?;
                });
                slots.extend([quote!(#host::param(&#ptr)), quote!(#host::param(&#len)), quote!(#host::param(&#flags)), quote!(#host::param(&#flags_len)), quote!(#host::param(&#tile))]);
                let flags_name = format!("{ident} (flags)");
                let name = ident.to_string();
                buffers.push(quote!((#ptr, #len * ::core::mem::size_of::<#elem>(), #name)));
                buffers.push(quote!((#flags, #flags_len * 4, #flags_name)));
                views.push(quote!(let #ident = #krate::__private::published(#ptr as *mut #elem, #len, #flags as *mut u32, #flags_len, #tile);));
                emulated_args.push(quote!(#ident));
            }
            ParamKind::Unsupported(_) => unreachable!("rejected by valid::check"),
        }
    }
    let emulated_call = with_retirement(kernel, quote!(super::#name(#(#emulated_args),*)));
    let emulated_call = quote!({ #(#views)* #emulated_call });
    let arg_names: Vec<_> = kernel.params.iter().map(|p| &p.ident).collect();
    let doc_launch = format!("Launches `{name_str}` on `stream` after checking `config` against the kernel's facts and the device.");

    quote! {
        #[cfg(not(target_arch = "nvptx64"))]
        #(#docs)*
        #[allow(non_snake_case)]
        #vis mod #name {
            #[allow(unused_imports)]
            use super::*;

            /// What the kernel attribute declared; the PTX entry carries the same facts.
            pub const FACTS: #host::KernelFacts = #host::KernelFacts {
                name: #name_str,
                max_threads: #max_threads,
                min_blocks: #min_blocks,
                cluster: #cluster,
                persistent: #persistent,
            };

            /// The kernel, loaded on one GPU, with its typed launcher.
            pub struct Kernel(#host::Kernel);

            /// Loads the kernel from this crate's embedded PTX (the module is loaded once per GPU).
            pub fn load(gpu: &#host::Gpu) -> #host::Result<Kernel> {
                gpu.load_kernel(&crate::__CLUSTERFUSE_PTX, &FACTS).map(Kernel)
            }

            impl Kernel {
                #[doc = #doc_launch]
                #[allow(clippy::too_many_arguments)]
                pub fn launch(&self, #stream: &#host::Stream, #config: &#host::LaunchConfig, #(#args),*) -> #host::Result<()> {
                    let #plan = self.0.plan(#config)?;
                    // SAFETY: `plan` was checked against the kernel and device; the parameters are
                    // lowered exactly as the PTX entry declares them.
                    unsafe { self.launch_planned(#stream, &#plan, #(#arg_names),*) }
                }

                /// Launches with a plan from [`Kernel::raw`]`().plan(..)`, skipping the checks.
                ///
                /// # Safety
                /// 1. `plan` came from this kernel's `plan` (or satisfies every check it makes).
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn launch_planned(&self, #stream: &#host::Stream, #plan: &#host::LaunchPlan, #(#args),*) -> #host::Result<()> {
                    #(#lowering)*
                    let mut #params = [#(#slots),*];
                    // On the emulator every thread runs the kernel's host build with the same
                    // arguments; the pointers are the emulator's host buffers.
                    // SAFETY: (in the closure) the buffers outlive the launch, which the
                    // emulator runs to completion before returning.
                    let #emulated = || unsafe { #emulated_call };
                    self.0.launch_lowered(#stream, #plan, &mut #params, &[#(#buffers),*], &#emulated)
                }

                /// The untyped kernel: its function handle, facts and planning.
                pub fn raw(&self) -> &#host::Kernel {
                    &self.0
                }
            }
        }
    }
}

/// `run` (the call of the kernel's body), then every `Published` parameter retired by every
/// block (their atomics issued together): the last block advances the epoch for the next
/// launch.
fn with_retirement(kernel: &Kernel, run: TokenStream) -> TokenStream {
    let krate = krate(kernel);
    let published: Vec<_> = kernel.params.iter().filter(|p| matches!(p.kind, ParamKind::Published(_))).map(|p| &p.ident).collect();
    if published.is_empty() {
        return run;
    }
    let copies: Vec<_> = published.iter().map(|p| format_ident!("{}__retire", p)).collect();
    let index = 0..copies.len();
    quote! {{
        #(let #copies = ::core::clone::Clone::clone(&#published);)*
        #run;
        #krate::block::sync();
        if #krate::thread::rank_in_block() == 0 {
            let retired = [#(#copies.retire_arrive()),*];
            #(#copies.retire_finish(retired[#index]);)*
        }
    }}
}

fn option(value: Option<u32>) -> TokenStream {
    match value {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    }
}
