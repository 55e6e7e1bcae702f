//! A byte budget many parties share: a bound on what all of them hold
//! together, that none of them can take from the process.
//!
//! A bound per party (a stream's window, a session's stream limit) keeps
//! each one small; a budget keeps all of them together below what the
//! operator set, however many parties a peer makes. Each party holds an
//! [`Account`] in the [`Budget`] and charges it what it holds as it comes
//! (bytes received and not yet read, bytes written and not yet sent), and
//! gives it back as it goes. Nothing is refused at the charge itself: a
//! party often cannot refuse bytes it already promised to take (a window it
//! granted). Instead:
//!
//! - past seven eighths of the limit the budget is *nearly full*: a party
//!   holding at least its share of the limit (the limit divided among the
//!   parties, one more counted for a newcomer) takes on nothing new (a new
//!   stream) and says so ([`Account::crowding`], [`Account::refused`]),
//!   while the others, holding little, still may;
//! - a charge that takes it past the limit *sheds* the parties holding the
//!   most, the largest first, until what the others hold fits again: each
//!   shed account is marked ([`Account::is_shed`]) and its waker woken, and
//!   its owner ends, letting go of everything it held, and tells its peer
//!   why. The party that charged may be among them.
//!
//! So the budget holds within its limit plus what arrives between a shed
//! and the shed party's letting go (its owner runs when woken), and the
//! party shed is the offender, the one holding the most, not whichever
//! came last.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;

/// A bound in bytes on what many [`Account`]s hold together. Cheap to
/// clone: clones are the same budget (and compare equal).
#[derive(Clone)]
pub struct Budget {
    shared: Arc<Shared>,
}

/// A [`Budget`] that does not keep it alive (for a sweeper that reports
/// every budget while it lives).
#[derive(Clone, Debug)]
pub struct WeakBudget(Weak<Shared>);

struct Shared {
    limit: usize,
    used: AtomicUsize,
    /// Accounts open (the members' count, read without the lock).
    accounts: AtomicUsize,
    members: Mutex<Members>,
    shed: AtomicU64,
    refused: AtomicU64,
}

#[derive(Default)]
struct Members {
    next: u64,
    by_key: HashMap<u64, Arc<Member>>,
}

#[derive(Default)]
struct Member {
    held: AtomicUsize,
    shed: AtomicBool,
    /// What it held when it was shed.
    held_when_shed: AtomicUsize,
    waker: Mutex<Option<Waker>>,
}

impl Budget {
    /// A budget of `limit` bytes (at least 1).
    pub fn new(limit: usize) -> Budget {
        Budget {
            shared: Arc::new(Shared {
                limit: limit.max(1),
                used: AtomicUsize::new(0),
                accounts: AtomicUsize::new(0),
                members: Mutex::new(Members::default()),
                shed: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> usize {
        self.shared.limit
    }

    /// What every account holds now, in bytes.
    pub fn used(&self) -> usize {
        self.shared.used.load(Ordering::Relaxed)
    }

    /// Accounts shed so far.
    pub fn shed(&self) -> u64 {
        self.shared.shed.load(Ordering::Relaxed)
    }

    /// What accounts refused to take on so far because the budget was
    /// nearly full (new streams, in the mux's case).
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Accounts open in it now.
    pub fn accounts(&self) -> usize {
        self.shared.accounts.load(Ordering::Relaxed)
    }

    /// Whether past seven eighths of the limit is held: parties take on
    /// nothing new.
    pub fn nearly_full(&self) -> bool {
        self.used() >= self.shared.limit - self.shared.limit / 8
    }

    /// A handle that does not keep the budget alive.
    pub fn downgrade(&self) -> WeakBudget {
        WeakBudget(Arc::downgrade(&self.shared))
    }

    /// Opens an account in the budget, holding nothing.
    pub fn account(&self) -> Account {
        let member = Arc::new(Member::default());
        let mut members = self.shared.lock();
        let key = members.next;
        members.next += 1;
        members.by_key.insert(key, member.clone());
        self.shared.accounts.fetch_add(1, Ordering::Relaxed);
        drop(members);
        Account {
            shared: self.shared.clone(),
            member,
            key,
        }
    }
}

impl WeakBudget {
    /// The budget, if it is still alive.
    pub fn upgrade(&self) -> Option<Budget> {
        self.0.upgrade().map(|shared| Budget { shared })
    }
}

impl PartialEq for Budget {
    fn eq(&self, other: &Budget) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for Budget {}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Members> {
        // Nothing panics while it is held; a poisoned table is still whole.
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sheds the members holding the most until what the others hold fits
    /// the limit again; wakes each one shed.
    fn shed_over(&self) {
        let mut woken = Vec::new();
        {
            let members = self.lock();
            let used = self.used.load(Ordering::Relaxed);
            // What members already shed still hold: theirs to let go.
            let mut letting_go: usize = members
                .by_key
                .values()
                .filter(|member| member.shed.load(Ordering::Relaxed))
                .map(|member| member.held.load(Ordering::Relaxed))
                .sum();
            while used.saturating_sub(letting_go) > self.limit {
                let largest = members
                    .by_key
                    .values()
                    .filter(|member| !member.shed.load(Ordering::Relaxed))
                    .max_by_key(|member| member.held.load(Ordering::Relaxed));
                let Some(largest) = largest else { break };
                let held = largest.held.load(Ordering::Relaxed);
                if held == 0 {
                    break;
                }
                largest.held_when_shed.store(held, Ordering::Relaxed);
                largest.shed.store(true, Ordering::Release);
                self.shed.fetch_add(1, Ordering::Relaxed);
                letting_go += held;
                let waker = largest
                    .waker
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                woken.extend(waker);
            }
        }
        woken.into_iter().for_each(Waker::wake);
    }
}

/// One party's share of a [`Budget`]: what it holds, charged as it takes
/// and given back as it lets go. Dropping it gives back what it still
/// holds and leaves the budget.
pub struct Account {
    shared: Arc<Shared>,
    member: Arc<Member>,
    key: u64,
}

/// What a [`Account::charge`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// Taken (the budget is within its limit, or others were shed for it).
    Taken,
    /// Taken, and this account is shed: it holds the most. Its owner must
    /// end and let go of what it holds.
    Shed,
    /// Not taken: it would have taken this account past the cap asked for
    /// ([`Account::charge_within`]).
    OverCap,
}

impl Account {
    /// The budget this account is in.
    pub fn budget(&self) -> Budget {
        Budget {
            shared: self.shared.clone(),
        }
    }

    /// Counts `bytes` more held. Past the budget's limit, the accounts
    /// holding the most are shed (this one perhaps).
    pub fn charge(&self, bytes: usize) -> Charge {
        if bytes == 0 {
            return self.shed_or_taken();
        }
        self.member.held.fetch_add(bytes, Ordering::Relaxed);
        self.take(bytes)
    }

    /// [`charge`](Account::charge), unless this account would hold more
    /// than `cap`: then nothing is charged ([`Charge::OverCap`]).
    pub fn charge_within(&self, bytes: usize, cap: usize) -> Charge {
        let fits = self
            .member
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|&after| after <= cap)
            });
        if fits.is_err() {
            return Charge::OverCap;
        }
        self.take(bytes)
    }

    fn take(&self, bytes: usize) -> Charge {
        let used = self.shared.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if used > self.shared.limit {
            self.shared.shed_over();
        }
        self.shed_or_taken()
    }

    fn shed_or_taken(&self) -> Charge {
        if self.is_shed() {
            Charge::Shed
        } else {
            Charge::Taken
        }
    }

    /// Counts `bytes` fewer held (at most what it holds).
    pub fn release(&self, bytes: usize) {
        let given = self
            .member
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(bytes))
            })
            .map_or(0, |before| before.min(bytes));
        debug_assert_eq!(given, bytes, "gave back more than was held");
        self.shared.used.fetch_sub(given, Ordering::Relaxed);
    }

    /// Gives back everything it holds.
    pub fn release_all(&self) {
        let held = self.member.held.swap(0, Ordering::Relaxed);
        self.shared.used.fetch_sub(held, Ordering::Relaxed);
    }

    /// What it holds now.
    pub fn held(&self) -> usize {
        self.member.held.load(Ordering::Relaxed)
    }

    /// Whether it was shed (it held the most when the budget went past its
    /// limit): its owner ends.
    pub fn is_shed(&self) -> bool {
        self.member.shed.load(Ordering::Acquire)
    }

    /// What it held when it was shed (0 if it was not).
    pub fn held_when_shed(&self) -> usize {
        self.member.held_when_shed.load(Ordering::Relaxed)
    }

    /// Whether the budget is nearly full (past seven eighths).
    pub fn nearly_full(&self) -> bool {
        let limit = self.shared.limit;
        self.shared.used.load(Ordering::Relaxed) >= limit - limit / 8
    }

    /// Whether this account should take on nothing new: the budget is
    /// nearly full and it holds at least its share of the limit (the limit
    /// divided among the accounts, one more counted for a newcomer). One
    /// holding less still may: the offender is held back, not everyone.
    pub fn crowding(&self) -> bool {
        let share = self.shared.limit / (self.shared.accounts.load(Ordering::Relaxed) + 1);
        self.nearly_full() && self.held() >= share
    }

    /// Counts one thing not taken on because the budget was nearly full.
    pub fn refused(&self) {
        self.shared.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Who to wake when this account is shed (its owner's task). Kept until
    /// replaced; woken once.
    pub fn set_waker(&self, waker: &Waker) {
        let mut slot = self.member.waker.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(kept) if kept.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("held", &self.held())
            .field("shed", &self.is_shed())
            .field("budget", &self.budget())
            .finish()
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        self.release_all();
        self.shared.lock().by_key.remove(&self.key);
        self.shared.accounts.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_and_gives_back() {
        let budget = Budget::new(1000);
        let a = budget.account();
        let b = budget.account();
        assert_eq!(a.charge(300), Charge::Taken);
        assert_eq!(b.charge(200), Charge::Taken);
        assert_eq!(budget.used(), 500);
        a.release(100);
        assert_eq!((a.held(), budget.used()), (200, 400));
        assert!(!budget.nearly_full());
        assert_eq!(b.charge(480), Charge::Taken);
        assert!(budget.nearly_full() && a.nearly_full(), "880 of 1000");
        // Shares of a third: b (680) holds more than its own, a (200) less.
        assert!(b.crowding() && !a.crowding());
        drop(b);
        assert_eq!((budget.used(), budget.accounts()), (200, 1));
        assert_eq!(budget.shed(), 0);
    }

    #[test]
    fn past_the_limit_the_largest_holder_is_shed_whoever_charged() {
        let budget = Budget::new(1000);
        let (big, small, other) = (budget.account(), budget.account(), budget.account());
        assert_eq!(big.charge(900), Charge::Taken);
        assert_eq!(other.charge(50), Charge::Taken);
        // The small one takes it past: the big one goes, not the small.
        assert_eq!(small.charge(100), Charge::Taken);
        assert!(big.is_shed() && !small.is_shed() && !other.is_shed());
        assert_eq!(big.held_when_shed(), 900);
        assert_eq!(budget.shed(), 1);
        // Until it lets go, more charges shed nobody else: what the others
        // hold fits.
        assert_eq!(other.charge(100), Charge::Taken);
        assert_eq!(budget.shed(), 1);
        big.release_all();
        assert_eq!(budget.used(), 250);
        // A shed account stays shed: its owner ends.
        assert_eq!(big.charge(1), Charge::Shed);
    }

    #[test]
    fn the_one_that_charges_may_be_the_one_shed() {
        let budget = Budget::new(100);
        let (a, b) = (budget.account(), budget.account());
        assert_eq!(b.charge(10), Charge::Taken);
        assert_eq!(a.charge(150), Charge::Shed);
        assert!(!b.is_shed());
    }

    #[test]
    fn a_shed_account_wakes_its_owner() {
        struct Flag(AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let budget = Budget::new(100);
        let (a, b) = (budget.account(), budget.account());
        a.set_waker(&Waker::from(flag.clone()));
        assert_eq!(a.charge(90), Charge::Taken);
        assert_eq!(b.charge(20), Charge::Taken);
        assert!(a.is_shed() && flag.0.load(Ordering::Relaxed));
    }

    #[test]
    fn a_cap_per_account_takes_nothing_past_it() {
        let budget = Budget::new(1000);
        let a = budget.account();
        assert_eq!(a.charge_within(60, 100), Charge::Taken);
        assert_eq!(a.charge_within(41, 100), Charge::OverCap);
        assert_eq!((a.held(), budget.used()), (60, 60));
        assert_eq!(a.charge_within(40, 100), Charge::Taken);
        assert_eq!(a.charge_within(usize::MAX, usize::MAX), Charge::OverCap);
    }

    #[test]
    fn clones_are_the_same_budget_and_a_weak_one_ends_with_it() {
        let budget = Budget::new(10);
        assert_eq!(budget, budget.clone());
        assert_ne!(budget, Budget::new(10));
        let weak = budget.downgrade();
        assert!(weak.upgrade().is_some());
        drop(budget);
        assert!(weak.upgrade().is_none());
    }
}
