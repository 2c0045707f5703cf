//! Header maps used again, per thread.
//!
//! Every proxied request makes two header maps (the request's and the upstream's answer's),
//! each two allocations, and both are done with within the exchange: the answer's once its head
//! is written out, the request's once its answer is. A map let go of here is cleared (its
//! lines dropped, its room kept) and the next head parsed on the thread takes it, so a busy
//! proxy does not allocate and free four blocks per request. Only small maps are kept, and only
//! a few: what the stash holds is bounded per thread, not per connection.

use std::cell::RefCell;

use http::HeaderMap;

/// Most maps kept per thread.
const STASH_MAX: usize = 8;

/// Largest map kept (in lines it holds without growing): a head of more lines than any usual
/// request or answer is not worth its room.
const KEPT_CAPACITY: usize = 32;

thread_local! {
    static STASH: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for `lines`: a stashed one, or a new one.
pub fn take(lines: usize) -> HeaderMap {
    match STASH.with(|stash| stash.borrow_mut().pop()) {
        Some(mut map) => {
            map.reserve(lines);
            map
        }
        None => HeaderMap::with_capacity(lines),
    }
}

/// Lets go of a map that is done with: cleared and kept for the next head on this thread,
/// unless it is large or the stash is full.
pub fn recycle(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > KEPT_CAPACITY {
        return;
    }
    map.clear();
    // `try_with`: a thread being torn down has no stash left; the map is simply dropped.
    let _ = STASH.try_with(|stash| {
        let mut stash = stash.borrow_mut();
        if stash.len() < STASH_MAX {
            stash.push(map);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_map_comes_back_empty_with_its_room() {
        let mut map = take(10);
        map.insert("x-a", "1".parse().unwrap());
        let room = map.capacity();
        recycle(map);
        let again = take(4);
        assert!(again.is_empty(), "a stashed map is handed out cleared");
        assert_eq!(
            again.capacity(),
            room,
            "with the room it had: no new allocation"
        );
    }

    #[test]
    fn large_maps_are_not_kept() {
        let mut big = HeaderMap::with_capacity(100);
        big.insert("x-a", "1".parse().unwrap());
        std::thread::spawn(move || {
            recycle(big);
            assert_eq!(
                take(1).capacity(),
                HeaderMap::<http::HeaderValue>::with_capacity(1).capacity()
            );
        })
        .join()
        .unwrap();
    }
}
