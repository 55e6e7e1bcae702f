//! Pub/sub membership: the topics a connection joined, kept with the
//! connection (so that its end knows what to leave, and "which topics is
//! this connection in" needs no search), under a lock of its own rather
//! than in the outbox every send takes.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::connection::wake::ConnWake;

/// Something that holds connections by name (a pub/sub's topics) and must
/// let go of a connection when it ends. The connection keeps the names it
/// joined, so that its end knows what to leave, and so that "which topics
/// is this connection in" is answered without a search.
pub(crate) trait Membership: Send + Sync {
    /// The connection `key` (`Conn::key`), which its driver wakes through
    /// `wake`, ended: drop it from `names`.
    fn leave(&self, key: usize, wake: &ConnWake, names: Vec<Arc<str>>);
}

/// The memberships a connection joined, with the names in each.
type Joined = Vec<(Arc<dyn Membership>, Vec<Arc<str>>)>;

/// The same membership (compared by address, not by vtable).
fn same(a: &Arc<dyn Membership>, b: &Arc<dyn Membership>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// A connection's memberships (boxed: most connections are in none).
#[derive(Default)]
pub(crate) struct Memberships(Mutex<Option<Box<Joined>>>);

impl Memberships {
    /// A panic elsewhere cannot leave the list half-changed (each change is
    /// one push or removal), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Option<Box<Joined>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records `name` in `membership`: `Some(false)` if it was there
    /// already, `None` if `open` says the connection takes no more sends.
    /// `open` is asked under this list's lock: the connection's end lets go
    /// of the list (`leave_all`) only after its sends were closed, so a
    /// join either sees them closed or is in the list that end takes.
    pub(crate) fn join(
        &self,
        membership: &Arc<dyn Membership>,
        name: &Arc<str>,
        open: impl FnOnce() -> bool,
    ) -> Option<bool> {
        let mut joined = self.lock();
        if !open() {
            return None;
        }
        let joined = joined.get_or_insert_with(Box::default);
        let names = match joined.iter_mut().find(|(m, _)| same(m, membership)) {
            Some((_, names)) => names,
            None => {
                joined.push((membership.clone(), Vec::new()));
                &mut joined.last_mut().expect("just pushed").1
            }
        };
        if names.iter().any(|known| **known == **name) {
            return Some(false);
        }
        names.push(name.clone());
        Some(true)
    }

    /// Forgets `name` in `membership`; false if it was not there.
    pub(crate) fn part(&self, membership: &Arc<dyn Membership>, name: &str) -> bool {
        let mut slot = self.lock();
        let Some(joined) = slot.as_mut() else {
            return false;
        };
        let Some(at) = joined.iter().position(|(m, _)| same(m, membership)) else {
            return false;
        };
        let names = &mut joined[at].1;
        let Some(found) = names.iter().position(|known| &**known == name) else {
            return false;
        };
        names.swap_remove(found);
        if names.is_empty() {
            joined.swap_remove(at);
            if joined.is_empty() {
                *slot = None;
            }
        }
        true
    }

    /// The names joined in `membership`.
    pub(crate) fn joined(&self, membership: &Arc<dyn Membership>) -> Vec<Arc<str>> {
        let joined = self.lock();
        let all = joined.as_deref().into_iter().flatten();
        all.filter(|(m, _)| same(m, membership))
            .flat_map(|(_, names)| names.iter().cloned())
            .collect()
    }

    /// Takes every membership, for the connection's end to leave.
    pub(crate) fn leave_all(&self) -> Joined {
        self.lock().take().map(|joined| *joined).unwrap_or_default()
    }
}
