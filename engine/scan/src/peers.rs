//! The walkers of one scan and how they hand work to each other (see `super::walk`).
//!
//! Each walker owns the directories it opened and an inbox. A walker with nothing left to list
//! puts its inbox on the idle list; a walker that pops a directory while others are idle hands
//! the shallowest directory still on its stack to one of them (the largest piece of work it
//! holds), and the receiver reports that directory's tree back to the owner's inbox when it is
//! complete. A directory is in exactly one walker's hands at a time, so no tree is built twice
//! and no listing is shared between threads.
//!
//! Invariant: the first walker (the calling thread) decides when the scan ends — when the root is
//! complete, or when a walker failed ([`Peers::abort`]) — and then stops every other walker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Mutex, PoisonError};

/// Where walkers find each other.
pub(super) struct Peers<T> {
    idle: Mutex<Vec<Sender<T>>>,
    /// Set once a walker failed (its sink refused a tree): every walker stops listing.
    aborted: AtomicBool,
    /// The first walker's inbox, woken when another one fails.
    first: Sender<T>,
}

impl<T> Peers<T> {
    pub fn new(first: Sender<T>) -> Self {
        Peers {
            idle: Mutex::new(Vec::new()),
            aborted: AtomicBool::new(false),
            first,
        }
    }

    /// Puts an inbox on the idle list.
    pub fn idle(&self, inbox: Sender<T>) {
        self.lock().push(inbox);
    }

    /// An idle walker's inbox, taken off the list: it is given work at once.
    pub fn take_idle(&self) -> Option<Sender<T>> {
        self.lock().pop()
    }

    /// Stops the scan: every walker stops listing, and the first one is woken with `wake`.
    pub fn abort(&self, wake: T) {
        self.aborted.store(true, Ordering::SeqCst);
        let _ = self.first.send(wake);
    }

    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Sender<T>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn an_idle_walker_is_given_work_once() {
        let (first, first_rx) = channel::<u32>();
        let peers = Peers::new(first);
        assert!(peers.take_idle().is_none());
        let (tx, rx) = channel();
        peers.idle(tx);
        peers.take_idle().unwrap().send(7).unwrap();
        assert!(peers.take_idle().is_none(), "taken once");
        assert_eq!(rx.recv().unwrap(), 7);
        assert!(!peers.aborted());
        peers.abort(9);
        assert!(peers.aborted());
        assert_eq!(first_rx.recv().unwrap(), 9, "the first walker is woken");
    }
}
