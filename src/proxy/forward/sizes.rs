//! The futures allocated for every request stay within glibc's per-thread cache: the request's
//! own (`Proxy::handle`), its attempt (`Upstream::attempt`) and its application answer
//! (`Proxy::application`). A larger one costs a trip into the allocator's bins and back (~0.7k
//! instructions a request); docs/development.md says what keeps them small. This test keeps that
//! from resting on a memory of `-Zprint-type-sizes`: a harmless-looking change that grows one
//! past the bound fails here.
//!
//! What it measures: `size_of` of the future type each function returns, named through the
//! function itself without calling it, so no proxy is built. An async block's layout is fixed on
//! MIR, before LLVM, so the test build (debug) and a release build differ only by the MIR passes
//! release adds: with rustc 1.95 these were 768, 728 and 824 bytes in the test build and 768, 720
//! and 816 in release (`cargo test --release --lib per_request_futures`, the numbers
//! `-Zprint-type-sizes` gives; a 1.97 nightly gives the same in the test build); since the
//! request's life became a state machine (`src/proxy/life.rs`) 768, 728 and 672 in the test build. The test build
//! errs on the large side, so a pass here holds for the release binary too. The bound is the
//! cache's, not today's sizes plus a margin: the documented promise is that each fits, and a
//! change that only moves them within it needs no edit here.

use std::mem::size_of;
use std::net::SocketAddr;

use http::Request;

use super::Exchange;
use crate::hold::RouteOutage;
use crate::proxy::answer::Answer;
use crate::proxy::attempt::Upstream;
use crate::proxy::{Proxy, Target};
use crate::replay::{ClientBody, ReplayBody};

/// The largest chunk glibc's per-thread cache serves on a 64-bit system (its largest bin, 1 040
/// bytes with the chunk header): a future up to this size is allocated and freed without a lock
/// or a search of the bins.
const THREAD_CACHE_MAX: usize = 1032;

/// The size of the future `f` returns (three arguments), without calling it.
fn returned_by_3<A, B, C, Fut>(_f: impl FnOnce(A, B, C) -> Fut) -> usize {
    size_of::<Fut>()
}

/// The size of the future `f` returns (four arguments), without calling it.
fn returned_by_4<A, B, C, D, Fut>(_f: impl FnOnce(A, B, C, D) -> Fut) -> usize {
    size_of::<Fut>()
}

#[test]
fn per_request_futures_fit_in_glibcs_thread_cache() {
    let sizes = [
        (
            "Proxy::handle",
            returned_by_3::<&'static Proxy, Request<ClientBody>, SocketAddr, _>(Proxy::handle),
        ),
        (
            "Upstream::attempt",
            returned_by_4::<
                &'static Upstream,
                &'static Target,
                Option<&'static RouteOutage>,
                ReplayBody,
                _,
            >(Upstream::attempt),
        ),
        (
            "Proxy::application",
            returned_by_3::<&'static Proxy, &'static mut Exchange, Answer, _>(Proxy::application),
        ),
    ];
    // Seen with `cargo test --lib sizes -- --nocapture`, for a before/after of a change.
    eprintln!("per-request futures, bytes: {sizes:?}");
    for (future, size) in sizes {
        assert!(
            size <= THREAD_CACHE_MAX,
            "the future of {future} is {size} bytes, over {THREAD_CACHE_MAX}: make it smaller \
             (docs/development.md, \"The futures allocated for every request\") rather than \
             raise the bound; all three: {sizes:?}"
        );
    }
}
