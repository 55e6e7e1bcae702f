//! The connections a server loop owns (a tokio group, an io_uring reactor),
//! by slot number: wakers and completions name a connection by its slot.
//!
//! Each connection is boxed, so growing the list moves pointers and a free
//! slot costs 8 bytes rather than a connection's size; freed slots are
//! reused, most recently freed first.

pub(crate) struct Slab<T> {
    slots: Vec<Option<Box<T>>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// The slot the next [`Slab::insert`] fills: a connection being made
    /// learns its slot before it exists.
    pub(crate) fn next_slot(&self) -> u32 {
        self.free.last().copied().unwrap_or(self.slots.len() as u32)
    }

    /// Puts `value` in the slot [`Slab::next_slot`] named, and returns it.
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            (self.slots.len() - 1) as u32
        });
        self.slots[slot as usize] = Some(Box::new(value));
        slot
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&T> {
        self.slots.get(slot as usize)?.as_deref()
    }

    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.slots.get_mut(slot as usize)?.as_deref_mut()
    }

    /// Takes the value out and frees its slot for reuse.
    pub(crate) fn remove(&mut self, slot: u32) -> Option<Box<T>> {
        let value = self.slots.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(value)
    }

    /// Takes the value out and never reuses its slot (late events for it
    /// must not reach another connection).
    pub(crate) fn retire(&mut self, slot: u32) -> Option<Box<T>> {
        self.slots.get_mut(slot as usize)?.take()
    }

    /// One past the highest slot ever used: every slot is below it.
    pub(crate) fn end(&self) -> u32 {
        self.slots.len() as u32
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten().map(|value| &**value)
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().flatten().map(|value| &mut **value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_named_before_filling_and_reused_after_removal() {
        let mut slab = Slab::default();
        assert_eq!(slab.next_slot(), 0);
        assert_eq!(slab.insert("a"), 0);
        assert_eq!(slab.insert("b"), 1);
        assert_eq!(slab.next_slot(), 2);
        assert_eq!(slab.remove(0).as_deref(), Some(&"a"));
        assert_eq!(slab.remove(0), None, "already free");
        assert_eq!(slab.next_slot(), 0, "the freed slot first");
        assert_eq!(slab.insert("c"), 0);
        assert_eq!(slab.get(1), Some(&"b"));
        assert_eq!(slab.retire(1).as_deref(), Some(&"b"));
        assert_eq!(slab.next_slot(), 2, "a retired slot is never reused");
        assert_eq!(slab.iter().collect::<Vec<_>>(), [&"c"]);
        assert_eq!(slab.end(), 2);
        assert_eq!(slab.get(7), None);
    }
}
