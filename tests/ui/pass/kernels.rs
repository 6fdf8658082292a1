// Kernels of every parameter kind, launch bounds and clusters expand to typed launchers.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("pass", "");

#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn saxpy(a: f32, x: &[f32], y: Out<f32>) {
    let i = thread::global_index_x();
    if i < y.len() {
        y.set(i, a.fma(x[i], y.get(i)));
    }
}

#[kernel(cluster(16, non_portable))]
pub fn halves(x: &[f16], y: Out<bf16>, n: u32) {
    let _ = (x, y, n);
}

#[kernel(persistent, launch_bounds(max_threads = 128))]
pub fn chain(y: Published<f32>, z: Out<f32>) {
    if block::index_x() == 0 {
        y.set(thread::index_x() as usize, 1.0);
        y.publish(0..1);
    }
    let ready = y.wait(0..64);
    z.set(0, ready.get(0));
}

// Parameters named as the launchers' own (`stream`, `config`, `plan`, `params`), and `mut` ones.
#[kernel]
pub fn named(mut stream: u32, config: &[f32], plan: Out<f32>, params: u32) {
    stream += params;
    let i = thread::global_index_x();
    if i < plan.len() {
        plan.set(i, config[i] + stream as f32);
    }
}

// Parameter types from `macro_rules!` (`$t:ty` arrives wrapped in an invisible group).
macro_rules! scale {
    ($name:ident, $input:ty, $output:ty) => {
        #[kernel]
        pub fn $name(a: f32, x: $input, y: $output) {
            let i = thread::global_index_x();
            if i < y.len() {
                y.set(i, a * x[i]);
            }
        }
    };
}
scale!(scale_f32, &[f32], Out<f32>);

fn main() {
    assert_eq!(saxpy::FACTS.max_threads, Some(256));
    assert_eq!(saxpy::FACTS.min_blocks, Some(2));
    assert_eq!(halves::FACTS.cluster, Some(clusterfuse::Dim3::new(16, 1, 1)));
    assert!(chain::FACTS.persistent && !saxpy::FACTS.persistent);
    let _: fn(&chain::Kernel, &clusterfuse::host::Stream, &clusterfuse::host::LaunchConfig, &mut clusterfuse::host::Published<f32>, &mut clusterfuse::host::Buffer<f32>) -> clusterfuse::host::Result<()> = chain::Kernel::launch;
    let _: fn(&clusterfuse::host::Gpu) -> clusterfuse::host::Result<saxpy::Kernel> = saxpy::load;

    let gpu = clusterfuse::host::Gpu::emulator();
    let (x, mut y) = (gpu.upload(&[1.0f32, 2.0, 3.0]).unwrap(), gpu.upload(&[0.0f32; 3]).unwrap());
    let config = clusterfuse::host::LaunchConfig { block: 32.into(), ..Default::default() };
    named::load(&gpu).unwrap().launch(gpu.stream(), &config, 10, &x, &mut y, 5).unwrap();
    assert_eq!(gpu.download(&y).unwrap(), [16.0, 17.0, 18.0]);
    scale_f32::load(&gpu).unwrap().launch(gpu.stream(), &config, 2.0, &x, &mut y).unwrap();
    assert_eq!(gpu.download(&y).unwrap(), [2.0, 4.0, 6.0]);
}
