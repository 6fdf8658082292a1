//! Emulated threads as fibers (stackful coroutines): each runs until it reaches a barrier,
//! then hands control back to its cluster's scheduler.

use super::schedule::Wait;
use super::thread::{enter, Thread};
use core::cell::{Cell, RefCell};
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};
use std::boxed::Box;
use std::panic::{self, AssertUnwindSafe};
use std::string::{String, ToString};
use std::sync::Once;

/// What the scheduler tells a suspended thread.
pub enum Resume {
    /// Carry on: the barrier completed.
    Go,
    /// The launch failed elsewhere: unwind and end.
    Abort,
}

/// The handle a fiber suspends through.
pub type Yielder = corosensei::Yielder<Resume, Wait>;

/// How far a resumed fiber got.
pub enum Step {
    /// It waits at a barrier.
    Wait(Wait),
    /// It returned, or panicked with this message.
    Done(Result<(), String>),
}

/// Fiber stacks: kernels' frames are small, but unoptimised builds are generous with them.
const STACK_BYTES: usize = 128 * 1024;

/// One emulated thread's fiber.
pub struct Fiber {
    coroutine: Coroutine<Resume, Wait, Result<(), String>, DefaultStack>,
    thread: Box<Thread>,
}

/// The panic payload that unwinds an aborted fiber.
struct Aborted;

impl Fiber {
    /// A fiber that runs `body` as `thread`, on `stack` (or a new one).
    ///
    /// # Safety
    /// 1. `body` and everything `thread` points to outlive the fiber's run: it is run to
    ///    completion (aborted fibers too) before they are dropped.
    pub unsafe fn new(thread: Box<Thread>, body: &(dyn Fn() + Sync), stack: Option<DefaultStack>) -> Self {
        install_quiet_panic_hook();
        let stack = stack.unwrap_or_else(|| DefaultStack::new(STACK_BYTES).expect("cannot allocate an emulator fiber stack"));
        let this: *const Thread = &*thread;
        let body: *const (dyn Fn() + Sync) = body;
        // SAFETY: the caller keeps `body` and the thread alive until the coroutine completes.
        let coroutine = unsafe {
            Coroutine::with_stack_unchecked(stack, move |yielder: &Yielder, start: Resume| {
                if let Resume::Abort = start {
                    return Err(String::from("aborted before it started"));
                }
                (*this).yielder.set(yielder);
                panic::catch_unwind(AssertUnwindSafe(|| (*body)())).map_err(|payload| panic_message(&*payload))
            })
        };
        Self { coroutine, thread }
    }

    /// The thread it emulates.
    pub fn thread(&self) -> &Thread {
        &self.thread
    }

    /// Runs the fiber until it waits or ends.
    pub fn resume(&mut self, how: Resume) -> Step {
        let _current = enter(&self.thread);
        IN_KERNEL.set(true);
        let result = self.coroutine.resume(how);
        IN_KERNEL.set(false);
        match result {
            CoroutineResult::Yield(wait) => Step::Wait(wait),
            CoroutineResult::Return(outcome) => Step::Done(outcome),
        }
    }

    /// True once it has returned.
    pub fn done(&self) -> bool {
        self.coroutine.done()
    }

    /// Its stack, for the next fiber.
    pub fn into_stack(self) -> DefaultStack {
        self.coroutine.into_stack()
    }
}

/// Suspends the calling fiber at `wait` until the scheduler resumes it.
pub fn suspend(thread: &Thread, wait: Wait) {
    // Unwinding (an abort or a panic) must not stop at a barrier on its way out.
    if std::thread::panicking() {
        return;
    }
    // SAFETY: set when the fiber started; the yielder lives on the fiber's own stack.
    let yielder = unsafe { &*thread.yielder.get() };
    match yielder.suspend(wait) {
        Resume::Go => {}
        Resume::Abort => panic::resume_unwind(Box::new(Aborted)),
    }
}

std::thread_local! {
    static IN_KERNEL: Cell<bool> = const { Cell::new(false) };
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics inside emulated kernels become launch errors, so the default hook's report (with
/// a backtrace note) is kept for panics elsewhere; inside kernels only the location is kept.
fn install_quiet_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if IN_KERNEL.get() {
                PANIC_LOCATION.set(info.location().map(|l| l.to_string()));
            } else {
                previous(info)
            }
        }));
    });
}

fn panic_message(payload: &(dyn core::any::Any + Send)) -> String {
    if payload.is::<Aborted>() {
        return String::from("aborted");
    }
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| String::from("panicked"));
    match PANIC_LOCATION.take() {
        Some(location) => std::format!("{message} (at {location})"),
        None => message,
    }
}
