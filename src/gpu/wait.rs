//! Waiting for the device. Natively the thread blocks (pollster, a device
//! poll). In a browser tab nothing may block: the wasm stack suspends
//! instead (JavaScript Promise Integration). `lfmSuspend` is an import that
//! the page's loader (`web/lfm.js`) replaces with a `WebAssembly.Suspending`
//! function returning a promise that resolves on the event loop's next
//! task; while the stack is suspended the browser delivers `mapAsync`,
//! `requestDevice` and error-scope results, and the engine's synchronous
//! code resumes where it waited.

use crate::error::{Error, Result};
use std::future::Future;
use std::sync::mpsc::Receiver;

/// Runs `fut` to completion on this thread.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    #[cfg(not(target_arch = "wasm32"))]
    {
        pollster::block_on(fut)
    }
    #[cfg(target_arch = "wasm32")]
    {
        let mut fut = std::pin::pin!(fut);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            web::lfm_suspend();
        }
    }
}

#[cfg(target_arch = "wasm32")]
mod web {
    use wasm_bindgen::prelude::*;

    #[wasm_bindgen]
    extern "C" {
        /// Suspends the wasm stack until the event loop's next task (see
        /// the module docs); without JSPI the page's stand-in throws.
        #[wasm_bindgen(js_name = lfmSuspend)]
        pub fn lfm_suspend();
    }
}

/// Waits until submission `done` has finished and the `map_async` callback
/// feeding `mapped` has run; `what` names the wait in errors.
pub(crate) fn wait_mapped(
    device: &wgpu::Device,
    done: Option<wgpu::SubmissionIndex>,
    mapped: Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    what: &str,
) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    let result = {
        device
            .poll(wgpu::PollType::Wait {
                submission_index: done,
                timeout: None,
            })
            .map_err(|e| Error::gpu(format!("{what}: {e}")))?;
        mapped
            .recv()
            .map_err(|_| Error::gpu(format!("{what}: map callback dropped")))?
    };
    #[cfg(target_arch = "wasm32")]
    let result = {
        let _ = (device, done);
        loop {
            match mapped.try_recv() {
                Ok(r) => break r,
                Err(std::sync::mpsc::TryRecvError::Empty) => web::lfm_suspend(),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    return Err(Error::gpu(format!("{what}: map callback dropped")))
                }
            }
        }
    };
    result.map_err(|e| Error::gpu(format!("{what}: {e}")))
}
