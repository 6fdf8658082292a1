//! Code generation for `#[fused_kernel]`: the stages become plain `#[inline(always)]`
//! device functions over the values the markers stand for, and the dataflow becomes one
//! `#[kernel]` function named after the module, which allocates the shared arrays and puts a
//! barrier after every stage that writes shared memory. The launcher is `#[kernel]`'s.

use super::ast::{grid_names, Arg, Fused, Port, Scope, Space, Stage};
use proc_macro2::{Group, Ident, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use clusterfuse_device::limits::MAX_THREADS_PER_BLOCK;
use syn::{FnArg, Pat, ReturnType, Type};

/// The module's plain items next to the errors, so that one mistake does not cascade into
/// errors about missing constants or imports.
pub fn fallback(fused: &Fused, err: syn::Error) -> TokenStream {
    let err = err.to_compile_error();
    let module = &fused.module;
    let (attrs, vis, name, items) = (&module.attrs, &module.vis, &module.ident, &fused.items);
    quote! {
        #err
        #(#attrs)*
        #[allow(dead_code, unused_imports)]
        #vis mod #name {
            #(#items)*
        }
    }
}

fn krate(fused: &Fused) -> TokenStream {
    match &fused.krate {
        Some(path) => quote!(#path),
        None => quote!(::clusterfuse),
    }
}

pub fn fused(fused: &Fused) -> TokenStream {
    let krate = krate(fused);
    let module = &fused.module;
    let (attrs, vis, name, items) = (&module.attrs, &module.vis, &module.ident, &fused.items);
    let stages = fused.stages.iter().map(|s| stage_fn(s, &krate));
    let entry = entry_fn(fused, &krate);
    let config = config_fn(fused, &krate);
    quote! {
        #(#attrs)*
        #vis mod #name {
            #(#items)*
            #(#stages)*
            #entry
            #[cfg(not(target_arch = "nvptx64"))]
            pub use self::#name::{load, Kernel, FACTS};
            #config
        }
    }
}

/// What a marker stands for at run time.
fn lowered(port: &Port, krate: &TokenStream) -> TokenStream {
    let ty = &port.ty;
    match (port.space, ty) {
        (Space::Shared | Space::Dsmem, Type::Array(array)) => {
            let elem = &array.elem;
            quote_spanned!(port.written.span()=> #krate::shared::SharedSlice<#elem>)
        }
        (Space::GlobalIn, _) => quote_spanned!(port.written.span()=> &[#ty]),
        (Space::GlobalOut, _) => quote_spanned!(port.written.span()=> &#krate::global::Out<'_, #ty>),
        _ => quote!(#ty),
    }
}

fn stage_fn(stage: &Stage, krate: &TokenStream) -> TokenStream {
    let mut item = stage.item.clone();
    let ports: Vec<&Port> = stage.inputs.iter().chain(&stage.outputs).collect();
    for input in item.sig.inputs.iter_mut() {
        if let FnArg::Typed(typed) = input {
            if let Pat::Ident(pat) = &*typed.pat {
                if let Some(port) = ports.iter().find(|p| p.ident == pat.ident) {
                    *typed.ty = syn::parse2(lowered(port, krate)).expect("a lowered type parses");
                }
            }
        }
    }
    let returned: Vec<TokenStream> = stage.outputs.iter().filter(|p| p.space == Space::Registers).map(|p| lowered(p, krate)).collect();
    if let ReturnType::Type(_, ty) = &mut item.sig.output {
        let lowered = if returned.len() == 1 { quote!(#(#returned)*) } else { quote!((#(#returned),*)) };
        **ty = syn::parse2(lowered).expect("a tuple type parses");
    }
    quote! {
        #[inline(always)]
        #item
    }
}

fn entry_fn(fused: &Fused, krate: &TokenStream) -> TokenStream {
    let entry = &fused.entry.item;
    let (attrs, sig) = (&entry.attrs, &entry.sig);
    let inputs = &sig.inputs;
    let name = &fused.module.ident;
    let mut body = Vec::new();
    // Cluster barriers the plan needs beyond those after cluster stages' shared outputs: one
    // before a stage reads peers' shared memory (`Dsmem`) written since the last, and one at
    // the end where peers' memory was read since the last, so that no block exits (freeing
    // its shared memory) while its peers still read it.
    let mut produced_at: Vec<(&Ident, usize)> = Vec::new();
    let mut last_cluster_sync: Option<usize> = None; // steps done before it
    let mut peers_read = false;
    for (i, step) in fused.entry.steps.iter().enumerate() {
        let stage = fused.stage(&step.stage).expect("checked");
        let mut args = step.args.iter().map(|a| match a {
            Arg::Name(name) => name,
            Arg::Other(_) => unreachable!("rejected by check"),
        });
        let mut call_args = Vec::new();
        for input in &stage.item.sig.inputs {
            let FnArg::Typed(typed) = input else { continue };
            let Pat::Ident(pat) = &*typed.pat else { continue };
            if let Some(i) = stage.outputs.iter().position(|p| p.ident == pat.ident) {
                let bind = &step.binds[i];
                let ty = &stage.outputs[i].ty;
                let ty = respan(quote!(#ty), bind.span());
                body.push(quote_spanned!(bind.span()=> let #bind = #krate::shared!(#ty);));
                call_args.push(quote!(#bind));
            } else {
                let port = stage.inputs.iter().find(|p| p.ident == pat.ident).expect("an input");
                let arg = args.next().expect("arity checked");
                if port.space == Space::Dsmem {
                    let written = produced_at.iter().rev().find(|(name, _)| *name == arg).map_or(0, |&(_, at)| at + 1);
                    if last_cluster_sync.is_none_or(|synced| synced < written) {
                        body.push(quote!(#krate::cluster::sync();));
                        last_cluster_sync = Some(i);
                    }
                    peers_read = true;
                }
                call_args.push(if port.space == Space::GlobalOut { quote!(&#arg) } else { quote!(#arg) });
            }
        }
        let stage_name = stage.name();
        let returned: Vec<_> = stage.outputs.iter().zip(&step.binds).filter(|(p, _)| p.space == Space::Registers).map(|(_, b)| b).collect();
        body.push(match returned.len() {
            0 => quote!(#stage_name(#(#call_args),*);),
            1 => quote!(let #(#returned)* = #stage_name(#(#call_args),*);),
            _ => quote!(let (#(#returned),*) = #stage_name(#(#call_args),*);),
        });
        if stage.outputs.iter().any(|p| p.space.is_shared()) {
            if stage.scope.value == Scope::Cluster {
                body.push(quote!(#krate::cluster::sync();));
                (last_cluster_sync, peers_read) = (Some(i + 1), false);
            } else {
                body.push(quote!(#krate::block::sync();));
            }
        }
        produced_at.extend(step.binds.iter().map(|bind| (bind, i)));
    }
    if peers_read {
        body.push(quote!(#krate::cluster::sync_after_reads();));
    }
    let (max_threads, min_blocks) = match &fused.launch_bounds {
        Some(bounds) => (bounds.max_threads.value, bounds.min_blocks.map(|m| m.value)),
        None => (fused.block.value.map_or(MAX_THREADS_PER_BLOCK, |b| b.value), None),
    };
    let min_blocks = min_blocks.map(|m| quote!(, min_blocks = #m));
    let cluster = fused.cluster.as_ref().map(|c| {
        let [x, y, z] = c.dims;
        let non_portable = c.non_portable.then(|| quote!(, non_portable));
        quote!(, cluster(#x, #y, #z #non_portable))
    });
    // Parameters that only size the grid are launch arguments too.
    let grid_only = launch_names(fused).into_iter().filter(|n| fused.entry.params.iter().any(|p| &p.ident == n));
    quote! {
        #(#attrs)*
        #[#krate::kernel(launch_bounds(max_threads = #max_threads #min_blocks) #cluster, crate = #krate)]
        pub fn #name(#inputs) {
            #(let _ = #grid_only;)*
            #(#body)*
        }
    }
}

/// `config(..)`: the declared grid, block and dynamic shared memory as a launch configuration;
/// its parameters are the kernel parameters the grid names.
fn config_fn(fused: &Fused, krate: &TokenStream) -> TokenStream {
    let host = quote!(#krate::__private::host);
    let grid = &fused.grid;
    let block = &fused.block.expr;
    let dynamic = fused.dynamic_smem.map_or(0, |d| d.value);
    let names = launch_names(fused);
    let params = fused.entry.params.iter().filter(|p| names.contains(&p.ident)).map(|p| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote!(#ident: #ty)
    });
    quote! {
        /// The launch configuration `#[fused_kernel]` declares: grid, block and dynamic
        /// shared memory (the cluster comes from the kernel).
        #[cfg(not(target_arch = "nvptx64"))]
        pub fn config(#(#params),*) -> #host::LaunchConfig {
            #host::LaunchConfig {
                grid: #host::Dim3::new((#grid) as u32, 1, 1),
                block: #host::Dim3::new((#block) as u32, 1, 1),
                cluster: ::core::option::Option::None,
                dynamic_smem_bytes: #dynamic,
                ..#host::LaunchConfig::default()
            }
        }
    }
}

/// The names the grid and block expressions read.
fn launch_names(fused: &Fused) -> Vec<syn::Ident> {
    let mut names = grid_names(&fused.grid);
    for name in grid_names(&fused.block.expr) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// `tokens` with every span set to `span`: each allocation's `shared!` symbol is named after
/// its `let`, so that a stage called twice gets two arrays.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            }
            token.set_span(span);
            token
        })
        .collect()
}
