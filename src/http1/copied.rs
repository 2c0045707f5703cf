//! Copies of small pieces of a read buffer (a head, a small body frame) that are then shared by
//! their slices.
//!
//! `Bytes::copy_from_slice` makes a `Vec`-backed `Bytes`, and the first slice taken of it moves
//! the count of its sharers into an allocation of its own: two allocations per copy, two frees.
//! Here a small copy is one allocation, its bytes inline beside that count (`Bytes::from_owner`
//! over a fixed-size array), in one of three sizes that stay within the allocator's per-thread
//! cache. Larger copies are made as before.

use bytes::Bytes;

/// The inline sizes: with the owner's count and length, 264, 520 and 1 032 bytes an allocation.
const SMALL: usize = 248;
const MEDIUM: usize = 504;
const LARGE: usize = 1016;

/// A copy of `bytes`, shared by whatever is sliced from it.
pub fn copy(bytes: &[u8]) -> Bytes {
    match bytes.len() {
        0 => Bytes::new(),
        n if n <= SMALL => inline::<SMALL>(bytes),
        n if n <= MEDIUM => inline::<MEDIUM>(bytes),
        n if n <= LARGE => inline::<LARGE>(bytes),
        _ => Bytes::copy_from_slice(bytes),
    }
}

/// Up to `N` bytes held inline.
struct Inline<const N: usize> {
    len: usize,
    bytes: [u8; N],
}

impl<const N: usize> AsRef<[u8]> for Inline<N> {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn inline<const N: usize>(bytes: &[u8]) -> Bytes {
    let mut owner = Inline {
        len: bytes.len(),
        bytes: [0; N],
    };
    owner.bytes[..bytes.len()].copy_from_slice(bytes);
    Bytes::from_owner(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_copies_its_bytes_and_slices_share_them() {
        for len in [
            0,
            1,
            SMALL,
            SMALL + 1,
            MEDIUM,
            MEDIUM + 1,
            LARGE,
            LARGE + 1,
            5000,
        ] {
            let source: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let copied = copy(&source);
            assert_eq!(copied, source, "{len}");
            let tail = copied.slice(len / 2..);
            drop(copied);
            assert_eq!(tail, source[len / 2..], "{len}: a slice outlives the copy");
        }
    }
}
