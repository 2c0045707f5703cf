//! A slab: values in reusable slots, so a registry that takes and frees an entry per request or
//! per connection stops allocating once it has grown to the peak.

/// Values in slots; a freed slot is taken again first.
#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<usize>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value`; its slot.
    pub fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(value);
                i
            }
            None => {
                self.slots.push(Some(value));
                self.slots.len() - 1
            }
        }
    }

    /// Takes the value out of `slot`, if there is one.
    pub fn remove(&mut self, slot: usize) -> Option<T> {
        let value = self.slots.get_mut(slot).and_then(Option::take)?;
        self.len -= 1;
        self.free.push(slot);
        Some(value)
    }

    /// The value in `slot`.
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut T> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every value, in slot order (not insertion order: slots are reused).
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_slots_are_reused_and_counted() {
        let mut slab = Slab::default();
        let (a, b) = (slab.insert("a"), slab.insert("b"));
        assert_eq!(slab.remove(a), Some("a"));
        assert_eq!(slab.remove(a), None, "removed once");
        assert_eq!(slab.insert("c"), a, "the freed slot first");
        assert_eq!(slab.len(), 2);
        *slab.get_mut(b).unwrap() = "B";
        assert_eq!(slab.iter().copied().collect::<Vec<_>>(), ["c", "B"]);
        assert_eq!(slab.remove(99), None);
        slab.remove(a);
        slab.remove(b);
        assert!(slab.is_empty());
    }
}
