//! Header maps, and the buffers heads are written into, used again, per thread.
//!
//! Every proxied request makes two header maps (the request's and the upstream's answer's),
//! each two allocations, and both are done with within the exchange: the answer's once its head
//! is written out, the request's once its answer is. A map let go of here is cleared (its
//! lines dropped, its room kept) and the next head parsed on the thread takes it, so a busy
//! proxy does not allocate and free four blocks per request. Only small maps are kept, and only
//! a few: what the stash holds is bounded per thread, not per connection.
//!
//! The same goes for the two buffers a proxied request's heads are written into (the request's
//! for the upstream, the answer's for the client): each is let go of once written out, and the
//! next head written on the thread takes it.

use std::cell::RefCell;
use std::thread::LocalKey;

use http::HeaderMap;

/// Most maps, and most head buffers, kept per thread.
const STASH_MAX: usize = 8;

/// Largest map kept (in lines it holds without growing): a head of more lines than any usual
/// request or answer is not worth its room.
const KEPT_CAPACITY: usize = 32;

/// Largest head buffer kept: a head of more bytes than any usual one is not worth its room.
const KEPT_HEAD_BYTES: usize = 2048;

type Stash<T> = LocalKey<RefCell<Vec<T>>>;

thread_local! {
    static MAPS: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
    static HEADS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// The last thing `stash` was given, if any.
fn pop<T: 'static>(stash: &'static Stash<T>) -> Option<T> {
    stash.with(|stash| stash.borrow_mut().pop())
}

/// Gives `item` (already emptied) to `stash`, unless it is full.
fn keep<T: 'static>(stash: &'static Stash<T>, item: T) {
    // `try_with`: a thread being torn down has no stash left; the item is simply dropped.
    let _ = stash.try_with(|stash| {
        let mut stash = stash.borrow_mut();
        if stash.len() < STASH_MAX {
            stash.push(item);
        }
    });
}

/// An empty buffer with room for `len` bytes of a head: a stashed one, or a new one.
pub fn head_buffer(len: usize) -> Vec<u8> {
    match pop(&HEADS) {
        Some(mut buf) => {
            buf.reserve(len);
            buf
        }
        None => Vec::with_capacity(len),
    }
}

/// Lets go of a head buffer that is written out: emptied and kept for the next head on this
/// thread, unless it is large or the stash is full.
pub fn recycle_head(mut buf: Vec<u8>) {
    if (1..=KEPT_HEAD_BYTES).contains(&buf.capacity()) {
        buf.clear();
        keep(&HEADS, buf);
    }
}

/// An empty map with room for `lines`: a stashed one, or a new one.
pub fn take(lines: usize) -> HeaderMap {
    match pop(&MAPS) {
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
    if (1..=KEPT_CAPACITY).contains(&map.capacity()) {
        map.clear();
        keep(&MAPS, map);
    }
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
    fn a_written_head_buffer_comes_back_empty_with_its_room_and_large_ones_are_not_kept() {
        std::thread::spawn(|| {
            let mut buf = head_buffer(300);
            buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
            let (room, at) = (buf.capacity(), buf.as_ptr());
            recycle_head(buf);
            let again = head_buffer(100);
            assert!(again.is_empty(), "handed out cleared");
            assert_eq!(
                (again.capacity(), again.as_ptr()),
                (room, at),
                "the same buffer"
            );
            let more = head_buffer(4000);
            assert!(more.capacity() >= 4000, "room for what is asked");
            recycle_head(more);
            assert!(
                head_buffer(10).capacity() < 4000,
                "a large buffer is not kept"
            );
        })
        .join()
        .unwrap();
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
