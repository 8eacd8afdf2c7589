//! A bounded queue with one lane per priority, for a stage's worker
//! threads: a worker takes from the highest non-empty lane, so a backlog of
//! low-priority requests never stands between a worker and a high-priority
//! one. The bound covers all lanes together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::FutureExt;

use super::priority::Priority;

/// Why a job was not queued.
pub enum Refused<T> {
    /// The queue holds its capacity.
    Full(T),
    /// The workers have stopped.
    Closed(T),
}

/// The sending side.
pub struct LanesSender<T> {
    lanes: [async_channel::Sender<T>; 3],
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

/// The receiving side; cloned for each worker.
pub struct LanesReceiver<T> {
    lanes: [async_channel::Receiver<T>; 3],
    queued: Arc<AtomicUsize>,
}

impl<T> Clone for LanesReceiver<T> {
    fn clone(&self) -> Self {
        LanesReceiver { lanes: self.lanes.clone(), queued: self.queued.clone() }
    }
}

/// A queue of at most `capacity` jobs over all lanes.
pub fn bounded<T>(capacity: usize) -> (LanesSender<T>, LanesReceiver<T>) {
    let capacity = capacity.max(1);
    let (high_tx, high_rx) = async_channel::bounded(capacity);
    let (normal_tx, normal_rx) = async_channel::bounded(capacity);
    let (low_tx, low_rx) = async_channel::bounded(capacity);
    let queued = Arc::new(AtomicUsize::new(0));
    (
        LanesSender { lanes: [high_tx, normal_tx, low_tx], queued: queued.clone(), capacity },
        LanesReceiver { lanes: [high_rx, normal_rx, low_rx], queued },
    )
}

impl<T> LanesSender<T> {
    /// Queues `job` in its priority's lane, or gives it back at once.
    pub fn try_send(&self, priority: Priority, job: T) -> Result<(), Refused<T>> {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Full(job));
        }
        self.lanes[priority.index()].try_send(job).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            match e {
                async_channel::TrySendError::Full(job) => Refused::Full(job),
                async_channel::TrySendError::Closed(job) => Refused::Closed(job),
            }
        })
    }

    /// Jobs waiting now.
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// True when no job waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the workers once the queued jobs are taken.
    pub fn close(&self) {
        for lane in &self.lanes {
            lane.close();
        }
    }
}

impl<T> LanesReceiver<T> {
    /// The next job, highest priority first, waiting (blocking the thread)
    /// while every lane is empty; `None` once the queue is closed and empty.
    pub fn recv_blocking(&self) -> Option<T> {
        loop {
            if let Some(job) = self.lanes.iter().find_map(|lane| lane.try_recv().ok()) {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                return Some(job);
            }
            if self.lanes.iter().all(|lane| lane.is_closed() && lane.is_empty()) {
                return None;
            }
            // Wait for any lane; what arrives is taken by the next turn of
            // the loop, in priority order (a received job is put first).
            let [high, normal, low] = &self.lanes;
            let job = futures::executor::block_on(async {
                futures::select_biased! {
                    job = high.recv().fuse() => job.ok(),
                    job = normal.recv().fuse() => job.ok(),
                    job = low.recv().fuse() => job.ok(),
                }
            });
            if let Some(job) = job {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                return Some(job);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_priority_jobs_are_taken_first_and_the_bound_covers_all_lanes() {
        let (tx, rx) = bounded::<u32>(4);
        assert!(tx.try_send(Priority::Low, 1).is_ok());
        assert!(tx.try_send(Priority::Low, 2).is_ok());
        assert!(tx.try_send(Priority::Normal, 3).is_ok());
        assert!(tx.try_send(Priority::High, 4).is_ok());
        assert!(matches!(tx.try_send(Priority::High, 5), Err(Refused::Full(5))));
        assert_eq!(tx.len(), 4);
        let order: Vec<u32> = (0..4).filter_map(|_| rx.recv_blocking()).collect();
        assert_eq!(order, vec![4, 3, 1, 2]);
        tx.close();
        assert_eq!(rx.recv_blocking(), None);
        assert!(matches!(tx.try_send(Priority::Normal, 6), Err(Refused::Closed(6))));
    }

    #[test]
    fn a_waiting_worker_wakes_for_any_lane() {
        let (tx, rx) = bounded::<u32>(2);
        let worker = std::thread::spawn(move || rx.recv_blocking());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(tx.try_send(Priority::Low, 7).is_ok());
        assert_eq!(worker.join().unwrap(), Some(7));
        assert!(tx.is_empty());
    }
}
