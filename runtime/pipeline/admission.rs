//! Admission: the bound on how many requests a queue holds at once, the
//! places each priority may take of it, and the quotas a request must fit.
//!
//! Backpressure is a type here: a request gets an [`AdmissionPermit`] or a
//! RESOURCE_EXHAUSTED error naming the queue or the quota, at once, never a
//! wait. The permit is released when the request is answered (or dropped),
//! so the bound covers waiting and running requests alike.
//!
//! Priorities share the places: a high-priority request may take any, a
//! normal one all but the share kept for high ones
//! (`traffic.high_priority_reserve`), a low one only its share
//! (`traffic.low_priority_share`). So a flood of low-priority requests is
//! refused while places remain for the others.
//!
//! Quotas ([`Quota`]) bound a pipeline, or every pipeline of a team
//! together, in requests per second (governor's GCRA, a token bucket
//! without a timer) and in requests at once.
//!
//! A pipeline's admission is bounded by time as well as by count
//! ([`Admission::bounded_by`]): once it has learned how fast the pipeline
//! answers under pressure ([`Pace`]), it holds only the requests that can
//! be answered within `max_queue_wait` of queueing, and it refuses at once
//! a request whose own deadline comes before the wait it would meet.
//! `max_in_flight` stays the hard bound (memory), and the places until a
//! rate is learned.
//!
//! The transport asks [`Admission::is_full`] before it reads a gRPC call,
//! to refuse it on its HTTP/2 stream for almost nothing. It says so only
//! once the admission has been refusing for [`PUSH_BACK_AFTER`] without a
//! pause: a passing burst is refused with RESOURCE_EXHAUSTED and a message
//! that names the queue, a sustained overload at the transport's price.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

// Tokio's clock, as the pace and the deadlines use.
use tokio::time::Instant;

use governor::{DefaultDirectRateLimiter, Quota as Rate, RateLimiter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::deadline::Deadline;
use super::pace::Pace;
use super::priority::Priority;
use crate::config::traffic::places;
use crate::config::{QuotaConfig, TrafficConfig};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, RejectionLabels};

/// A bounded entrance to a queue.
pub struct Admission {
    name: String,
    capacity: usize,
    /// The share of the places each priority may fill, by
    /// [`Priority::index`].
    shares: [f64; 3],
    /// The most places each priority may fill at `capacity`.
    limits: [usize; 3],
    /// The most queueing an admitted request should meet, when bounded
    /// by time.
    max_queue_wait: Option<Duration>,
    occupancy: Arc<Occupancy>,
    rejected: Counter,
    /// Refusals made by the transport before a request was read.
    pushed_back: Counter,
    /// Refusals of calls that waited too long to be read
    /// ([`Admission::refuse_late`]).
    late: Counter,
    in_flight: Gauge,
    /// The quotas a request must fit besides the places: the pipeline's
    /// own, then its team's.
    quotas: Vec<Arc<Quota>>,
}

/// How long an admission must have been refusing, without a pause, before
/// the transport refuses for it (no message, almost no cost).
pub const PUSH_BACK_AFTER: Duration = Duration::from_millis(100);

/// A gap between refusals this long ends a spell of refusing.
const REFUSING_GAP: Duration = Duration::from_millis(100);

/// When the current spell of refusals began and when the last came, in
/// microseconds from `origin`: what tells a sustained overload from a
/// burst. Races between refusals only blur the edges of a spell.
#[derive(Debug)]
struct Refusing {
    origin: Instant,
    since: AtomicU64,
    last: AtomicU64,
}

impl Refusing {
    fn new() -> Refusing {
        Refusing { origin: Instant::now(), since: AtomicU64::new(0), last: AtomicU64::new(0) }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A refusal now.
    fn refused(&self) {
        let now = self.now();
        let last = self.last.swap(now, Ordering::Relaxed);
        if now.saturating_sub(last) > REFUSING_GAP.as_micros() as u64 {
            self.since.store(now, Ordering::Relaxed);
        }
    }

    /// True when refusals have come without a pause for `PUSH_BACK_AFTER`.
    fn sustained(&self) -> bool {
        let now = self.now();
        now.saturating_sub(self.last.load(Ordering::Relaxed)) <= REFUSING_GAP.as_micros() as u64
            && now.saturating_sub(self.since.load(Ordering::Relaxed)) >= PUSH_BACK_AFTER.as_micros() as u64
    }
}

/// The places taken, and what their answers teach.
#[derive(Debug)]
struct Occupancy {
    used: AtomicUsize,
    pace: Pace,
    /// The places allowed now (learned), for the pace's notion of pressed.
    limit: AtomicUsize,
    /// The current spell of refusals, this admission's or its queues'.
    refusing: Refusing,
    /// How far refusals downstream have narrowed the places.
    squeeze: Squeeze,
}

impl Occupancy {
    fn new(capacity: usize) -> Occupancy {
        Occupancy {
            used: AtomicUsize::new(0),
            pace: Pace::new(),
            limit: AtomicUsize::new(capacity),
            refusing: Refusing::new(),
            squeeze: Squeeze::default(),
        }
    }
}

/// How long a downstream refusal narrows the places for before they widen
/// again, in microseconds: the places come back a step at a time once no
/// request admitted here has been refused downstream for this long.
const WIDEN_AFTER_MICROS: u64 = 100_000;

/// A downstream queue (the batch queue) refusing what this admission let
/// in means the learned places hold more than the queue serves in time:
/// each such refusal narrows them by a fifth (at most once per 10 ms, to
/// a twentieth at least), and they widen by a twentieth of the whole
/// every 50 ms once none has come for [`WIDEN_AFTER_MICROS`]: additive
/// increase, multiplicative decrease, as TCP meets a congested link. So
/// the wire refuses (cheaply, unread) what the queue would otherwise drop
/// after reading and decoding it.
#[derive(Debug)]
struct Squeeze {
    /// The share of the places allowed, as f64 bits.
    factor: AtomicU64,
    /// When it last narrowed and widened, in microseconds (`Refusing`'s
    /// clock).
    narrowed_at: AtomicU64,
    widened_at: AtomicU64,
}

impl Default for Squeeze {
    fn default() -> Self {
        Squeeze {
            factor: AtomicU64::new(1f64.to_bits()),
            narrowed_at: AtomicU64::new(0),
            widened_at: AtomicU64::new(0),
        }
    }
}

impl Squeeze {
    /// A refusal downstream at `now`.
    fn narrow(&self, now: u64) {
        let last = self.narrowed_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < 10_000 {
            return;
        }
        self.narrowed_at.store(now.max(1), Ordering::Relaxed);
        let factor = f64::from_bits(self.factor.load(Ordering::Relaxed));
        self.factor.store((factor * 0.8).max(0.05).to_bits(), Ordering::Relaxed);
    }

    /// The share of the places allowed now (`now` read only when they are
    /// narrowed: the common case reads no clock), widened a step when due.
    fn factor(&self, now: impl FnOnce() -> u64) -> f64 {
        let factor = f64::from_bits(self.factor.load(Ordering::Relaxed));
        if factor >= 1.0 {
            return 1.0;
        }
        let now = now();
        let quiet = now.saturating_sub(self.narrowed_at.load(Ordering::Relaxed)) >= WIDEN_AFTER_MICROS;
        let widened = self.widened_at.load(Ordering::Relaxed);
        if quiet && now.saturating_sub(widened) >= 50_000 {
            self.widened_at.store(now, Ordering::Relaxed);
            let wider = (factor + 0.05).min(1.0);
            self.factor.store(wider.to_bits(), Ordering::Relaxed);
            return wider;
        }
        factor
    }
}

/// Proof that a request was admitted; dropping it frees the place (and its
/// share of every concurrency quota).
#[derive(Debug)]
pub struct AdmissionPermit {
    occupancy: Arc<Occupancy>,
    admitted: Instant,
    /// A queue behind the admission refused the request: its end is no
    /// answer for the pace to learn from.
    dropped: bool,
    in_flight: Gauge,
    quotas: Vec<Arc<Quota>>,
}

impl std::fmt::Debug for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl AdmissionPermit {
    /// The batch queue behind the admission dropped the request as stale:
    /// the admission is pressed, its places narrow (`Squeeze`),
    /// and the refusal counts toward the spell after which the transport
    /// pushes back, so what the queue would drop is refused unread.
    pub fn dropped_downstream(&mut self) {
        self.dropped = true;
        let occupancy = &self.occupancy;
        occupancy.refusing.refused();
        occupancy.pace.refused();
        occupancy.squeeze.narrow(occupancy.refusing.now());
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        let left = self.occupancy.used.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        if !self.dropped {
            let limit = self.occupancy.limit.load(Ordering::Relaxed);
            self.occupancy.pace.answered(self.admitted, left, limit);
        }
        self.in_flight.dec();
        for quota in &self.quotas {
            quota.release();
        }
    }
}

impl Admission {
    /// An entrance for `capacity` requests at once, shared by priorities as
    /// `traffic` says; `name` appears in the error a refused request gets
    /// ("the request queue of model 'cnn'"); `rejected` counts the
    /// refusals, `in_flight` shows the requests admitted and not yet
    /// answered (what a drain waits for).
    pub fn new(
        name: impl Into<String>,
        capacity: usize,
        traffic: &TrafficConfig,
        rejected: Counter,
        in_flight: Gauge,
    ) -> Admission {
        let shares = [1.0, 1.0 - traffic.high_priority_reserve, traffic.low_priority_share];
        Admission {
            name: name.into(),
            capacity,
            shares,
            limits: limits_of(capacity, &shares),
            max_queue_wait: None,
            occupancy: Arc::new(Occupancy::new(capacity)),
            rejected,
            pushed_back: Counter::default(),
            late: Counter::default(),
            in_flight,
            quotas: Vec::new(),
        }
    }

    /// The same entrance, also bound by `quotas` (checked in order).
    pub fn with_quotas(mut self, quotas: Vec<Arc<Quota>>) -> Admission {
        self.quotas = quotas;
        self
    }

    /// The same entrance, its transport refusals counted in `pushed_back`.
    pub fn counting_push_back(mut self, pushed_back: Counter, late: Counter) -> Admission {
        self.pushed_back = pushed_back;
        self.late = late;
        self
    }

    /// Counts a call the transport refused unread because it waited too
    /// long in the server before it could be read (a standing queue in
    /// front of every admission: the server's own run queue), as a
    /// refusal of this admission: it is pressed, whatever its places say.
    pub fn refuse_late(&self) {
        self.late.inc();
        self.occupancy.refusing.refused();
        self.occupancy.pace.refused();
    }

    /// The same entrance, also bounded by time: at most `max_queue_wait`
    /// of queueing at the rate it learns, and no request admitted whose
    /// deadline comes before the wait it would meet.
    pub fn bounded_by(mut self, max_queue_wait: Duration) -> Admission {
        self.max_queue_wait = Some(max_queue_wait);
        self
    }

    /// The places now: `capacity`, or fewer once a rate is learned.
    fn places_now(&self) -> usize {
        let Some(bound) = self.max_queue_wait else { return self.capacity };
        let learned = self.occupancy.pace.places(bound, self.capacity);
        let factor = self.occupancy.squeeze.factor(|| self.occupancy.refusing.now());
        let places = if factor >= 1.0 { learned } else { ((learned as f64 * factor).ceil() as usize).max(1) };
        if self.occupancy.limit.load(Ordering::Relaxed) != places {
            self.occupancy.limit.store(places, Ordering::Relaxed);
        }
        places
    }

    /// The most places `priority` may fill now.
    fn limit_now(&self, priority: Priority) -> usize {
        let places = self.places_now();
        if places == self.capacity {
            return self.limits[priority.index()];
        }
        limits_of(places, &self.shares)[priority.index()]
    }

    /// Admits a request of `priority` due by `deadline`, or refuses it at
    /// once when the places its priority may take are full, when its
    /// deadline comes before the wait it would meet, or when a quota is
    /// spent.
    pub fn try_admit(&self, priority: Priority, deadline: Deadline) -> Result<AdmissionPermit> {
        let limit = self.limit_now(priority);
        let used = self.occupancy.used.fetch_add(1, Ordering::AcqRel);
        if used >= limit {
            self.occupancy.used.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refused(priority, limit));
        }
        if let Err(error) = self.check_deadline(deadline, used) {
            self.occupancy.used.fetch_sub(1, Ordering::AcqRel);
            return Err(error);
        }
        // Concurrency first (undone when a later check refuses), rates last
        // (a spent token cannot be given back).
        for (i, quota) in self.quotas.iter().enumerate() {
            if let Err(error) = quota.enter() {
                self.quotas[..i].iter().for_each(|q| q.release());
                self.occupancy.used.fetch_sub(1, Ordering::AcqRel);
                return Err(error);
            }
        }
        for quota in &self.quotas {
            if let Err(error) = quota.take_token() {
                self.quotas.iter().for_each(|q| q.release());
                self.occupancy.used.fetch_sub(1, Ordering::AcqRel);
                return Err(error);
            }
        }
        self.in_flight.inc();
        Ok(AdmissionPermit {
            occupancy: self.occupancy.clone(),
            admitted: Instant::now(),
            dropped: false,
            in_flight: self.in_flight.clone(),
            quotas: self.quotas.clone(),
        })
    }

    /// Refuses a request whose deadline comes before the wait it would
    /// meet behind `ahead` others, once the rate is learned.
    fn check_deadline(&self, deadline: Deadline, ahead: usize) -> Result<()> {
        let (Some(_), Some(due)) = (self.max_queue_wait, deadline.instant()) else { return Ok(()) };
        let Some(expected) = self.occupancy.pace.expected(ahead) else { return Ok(()) };
        let left = due.saturating_duration_since(Instant::now());
        if left >= expected {
            return Ok(());
        }
        self.rejected.inc();
        Err(Error::resource_exhausted(format!(
            "the request cannot be answered before its deadline: {:.1} ms left, and {} expects {:.1} ms ({ahead} \
             requests ahead, answered at {:.0} a second); retry with a longer deadline, or later",
            left.as_secs_f64() * 1e3,
            self.name,
            expected.as_secs_f64() * 1e3,
            self.occupancy.pace.rate().unwrap_or(0.0),
        )))
    }

    /// True, counting the refusal, when no request of `priority` could be
    /// admitted now and the admission has been refusing for
    /// [`PUSH_BACK_AFTER`]; admits nothing either way. The check the
    /// transport makes before it reads a request (`api::push_back`): no
    /// message is made.
    pub fn is_full(&self, priority: Priority) -> bool {
        if self.occupancy.used.load(Ordering::Acquire) < self.limit_now(priority)
            || !self.occupancy.refusing.sustained()
        {
            return false;
        }
        self.occupancy.refusing.refused();
        self.pushed_back.inc();
        self.occupancy.pace.refused();
        true
    }

    /// Refuses, as [`Admission::try_admit`] would, when no request of
    /// `priority` could be admitted now; admits nothing either way. A check
    /// an API makes before it reads a request's body (a request that passes
    /// it is still admitted, or refused, by `try_admit` later).
    pub fn refuse_if_full(&self, priority: Priority) -> Result<()> {
        let limit = self.limit_now(priority);
        if self.occupancy.used.load(Ordering::Acquire) < limit {
            return Ok(());
        }
        Err(self.refused(priority, limit))
    }

    /// Counts a refusal at `limit` places and says why.
    fn refused(&self, priority: Priority, limit: usize) -> Error {
        self.rejected.inc();
        self.occupancy.refusing.refused();
        self.occupancy.pace.refused();
        let places = self.places_now();
        if places < self.capacity {
            let bound = self.max_queue_wait.unwrap_or_default();
            return Error::resource_exhausted(format!(
                "{} is full: it holds {limit} {priority}-priority requests, the {:.0} ms of queueing it allows \
                 (max_queue_wait_ms) at the {:.0} requests a second it answers; retry later",
                self.name,
                bound.as_secs_f64() * 1e3,
                self.occupancy.pace.rate().unwrap_or(0.0),
            ));
        }
        if limit == self.capacity {
            return Error::queue_full(&self.name, self.capacity);
        }
        Error::resource_exhausted(format!(
            "{} is full for {priority}-priority requests: they may take {limit} of its {} places (the rest is kept \
             for higher priorities, [traffic]); retry later",
            self.name, self.capacity
        ))
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.occupancy.used.load(Ordering::Acquire)
    }

    /// Requests refused so far (for the queue's places; quotas count their
    /// own).
    pub fn rejected(&self) -> u64 {
        self.rejected.get()
    }

    /// The most requests admitted at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// The places each priority may fill of `total`, by [`Priority::index`]:
/// all for high, `shares` of them for the others, low never above normal.
fn limits_of(total: usize, shares: &[f64; 3]) -> [usize; 3] {
    let normal = places(total, shares[1]);
    let low = places(total, shares[2]).min(normal);
    [total, normal, low]
}

/// How every pipeline's admission is built: `[traffic]`, and each team's
/// quota, made once and shared by all the team's pipelines.
pub struct TrafficRules {
    config: TrafficConfig,
    teams: std::collections::BTreeMap<String, Arc<Quota>>,
}

impl TrafficRules {
    /// The rules `config` sets, with the team quotas made.
    pub fn new(config: &TrafficConfig, metrics: &Metrics) -> Arc<TrafficRules> {
        let teams = config
            .teams
            .iter()
            .map(|(team, quota)| {
                let name = format!("team '{team}'");
                (
                    team.clone(),
                    Quota::new(name, format!("traffic.teams.{team}"), &format!("team/{team}"), quota, metrics),
                )
            })
            .collect();
        Arc::new(TrafficRules { config: config.clone(), teams })
    }

    /// `[traffic]` as configured.
    pub fn config(&self) -> &TrafficConfig {
        &self.config
    }

    /// The admission of the endpoint `name` (`what`: "pipeline", "model"),
    /// `capacity` requests at once, bound by its own `quota` (configured at
    /// `key`) and by its team's.
    #[allow(clippy::too_many_arguments)]
    pub fn admission(
        &self,
        what: &str,
        name: &str,
        capacity: usize,
        team: Option<&str>,
        quota: Option<(&QuotaConfig, String)>,
        metrics: &Metrics,
    ) -> Admission {
        let queue = metrics.queue(&format!("{name}/admission"));
        let mut quotas = Vec::new();
        if let Some((config, key)) = quota {
            quotas.push(Quota::new(format!("{what} '{name}'"), key, &format!("{what}/{name}"), config, metrics));
        }
        if let Some(quota) = team.and_then(|team| self.teams.get(team)) {
            quotas.push(quota.clone());
        }
        let pushed_back = metrics.rejections.get_or_create_owned(&RejectionLabels {
            queue: format!("{name}/admission"),
            reason: "refused_stream".to_string(),
        });
        let late = metrics.rejections.get_or_create_owned(&RejectionLabels {
            queue: format!("{name}/admission"),
            reason: "late_read".to_string(),
        });
        Admission::new(format!("the request queue of {what} '{name}'"), capacity, &self.config, queue.full, queue.depth)
            .with_quotas(quotas)
            .counting_push_back(pushed_back, late)
    }
}

/// A quota: requests per second (with a burst) and requests at once, for
/// one pipeline or for all of a team's pipelines together.
pub struct Quota {
    /// What it is, in errors: "pipeline 'mlp'", "team 'search'".
    name: String,
    /// Where it is configured, in errors.
    key: String,
    rate: Option<(DefaultDirectRateLimiter, u32, u32)>,
    max_in_flight: Option<usize>,
    in_flight: AtomicUsize,
    rejected_rate: Counter,
    rejected_in_flight: Counter,
}

impl Quota {
    /// The quota `config` sets for `name` (configured at `key`); refusals
    /// are counted in `sluice_rejections{queue="quota/LABEL"}`.
    pub fn new(name: String, key: String, label: &str, config: &QuotaConfig, metrics: &Metrics) -> Arc<Quota> {
        let rate = config.requests_per_second.zip(config.burst_or_default()).and_then(|(per_second, burst)| {
            let rate = Rate::per_second(NonZeroU32::new(per_second)?).allow_burst(NonZeroU32::new(burst)?);
            Some((RateLimiter::direct(rate), per_second, burst))
        });
        let rejected = |reason: &str| {
            metrics
                .rejections
                .get_or_create_owned(&RejectionLabels { queue: format!("quota/{label}"), reason: reason.to_string() })
        };
        Arc::new(Quota {
            name,
            key,
            rate,
            max_in_flight: config.max_in_flight,
            in_flight: AtomicUsize::new(0),
            rejected_rate: rejected("quota_rate"),
            rejected_in_flight: rejected("quota_in_flight"),
        })
    }

    /// Takes one of its places at once, or refuses naming it.
    fn enter(&self) -> Result<()> {
        let Some(max) = self.max_in_flight else { return Ok(()) };
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= max {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.rejected_in_flight.inc();
            return Err(Error::resource_exhausted(format!(
                "{} is over its quota of {max} requests at once ({}.max_in_flight); retry later",
                self.name, self.key
            )));
        }
        Ok(())
    }

    /// Frees a place taken by [`Quota::enter`].
    fn release(&self) {
        if self.max_in_flight.is_some() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Spends one request of its rate, or refuses naming it.
    fn take_token(&self) -> Result<()> {
        let Some((limiter, per_second, burst)) = &self.rate else { return Ok(()) };
        if limiter.check().is_err() {
            self.rejected_rate.inc();
            return Err(Error::resource_exhausted(format!(
                "{} is over its quota of {per_second} requests per second, burst {burst} ({}.requests_per_second); \
                 retry later",
                self.name, self.key
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn admission(capacity: usize, traffic: &TrafficConfig, gauge: &Gauge) -> Admission {
        Admission::new("queue of model 'm'", capacity, traffic, Counter::default(), gauge.clone())
    }

    #[test]
    fn refuses_beyond_capacity_and_frees_on_drop() {
        let gauge = Gauge::default();
        let admission = admission(2, &TrafficConfig::default(), &gauge);
        assert!(admission.refuse_if_full(Priority::Normal).is_ok());
        let a = admission.try_admit(Priority::Normal, Deadline::NONE).unwrap();
        let _b = admission.try_admit(Priority::Normal, Deadline::NONE).unwrap();
        assert_eq!(admission.refuse_if_full(Priority::Normal).unwrap_err().code(), Code::ResourceExhausted);
        let err = admission.try_admit(Priority::High, Deadline::NONE).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("queue of model 'm'"), "{err}");
        assert_eq!(admission.rejected(), 2, "the check and the admission each count their refusal");
        assert_eq!(admission.in_flight(), 2);
        assert_eq!(gauge.get(), 2);
        drop(a);
        assert_eq!(gauge.get(), 1);
        assert!(admission.try_admit(Priority::Normal, Deadline::NONE).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_downstream_narrow_the_places_and_quiet_widens_them_again() {
        let admission =
            admission(100, &TrafficConfig::default(), &Gauge::default()).bounded_by(Duration::from_secs(10));
        // Nothing learned: the count bounds, a 10 s wait at any rate.
        assert_eq!(admission.places_now(), 100);
        // The batch queue refuses what was let in, three times 11 ms apart.
        for i in 0..3 {
            if i > 0 {
                tokio::time::advance(Duration::from_millis(11)).await;
            }
            let mut permit = admission.try_admit(Priority::Normal, Deadline::NONE).expect("admitted");
            permit.dropped_downstream();
            drop(permit);
        }
        // 100 × 0.8³ = 51.2.
        assert_eq!(admission.places_now(), 52);
        // A refusal within 10 ms of the last narrows no further.
        let mut permit = admission.try_admit(Priority::Normal, Deadline::NONE).expect("admitted");
        permit.dropped_downstream();
        drop(permit);
        assert_eq!(admission.places_now(), 52);
        // The drops count toward the spell after which the transport pushes
        // back (once the places are full too).
        assert!(admission.occupancy.refusing.now() > 0);
        // Quiet: after 100 ms, a twentieth back every 50 ms.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(admission.places_now(), 57);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(admission.places_now(), 62);
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(50)).await;
            admission.places_now();
        }
        assert_eq!(admission.places_now(), 100, "back to what was learned");
    }

    #[tokio::test(start_paused = true)]
    async fn the_transport_refuses_only_once_refusals_are_sustained() {
        let admission = admission(1, &TrafficConfig::default(), &Gauge::default());
        let _held = admission.try_admit(Priority::Normal, Deadline::NONE).unwrap();
        let step = Duration::from_millis(40);
        // A burst: refused with a message; the transport reads each call.
        for _ in 0..3 {
            assert!(!admission.is_full(Priority::Normal));
            assert!(admission.try_admit(Priority::Normal, Deadline::NONE).is_err());
            tokio::time::advance(step).await;
        }
        // 120 ms of refusals without a pause: now the transport refuses.
        assert!(admission.is_full(Priority::Normal));
        tokio::time::advance(step).await;
        assert!(admission.is_full(Priority::Normal), "its own refusals keep the spell going");
        // A pause ends the spell: the next refusal says why again.
        tokio::time::advance(REFUSING_GAP + step).await;
        assert!(!admission.is_full(Priority::Normal));
        assert!(admission.try_admit(Priority::Normal, Deadline::NONE).is_err());
        assert!(!admission.is_full(Priority::Normal));
    }

    #[test]
    fn low_priority_fills_only_its_share_and_high_keeps_its_reserve() {
        let traffic = TrafficConfig { high_priority_reserve: 0.2, low_priority_share: 0.5, ..TrafficConfig::default() };
        let admission = admission(10, &traffic, &Gauge::default());
        let low: Vec<_> = (0..5).map(|_| admission.try_admit(Priority::Low, Deadline::NONE).unwrap()).collect();
        let err = admission.try_admit(Priority::Low, Deadline::NONE).unwrap_err();
        assert!(err.message().contains("full for low-priority requests: they may take 5 of its 10"), "{err}");
        let normal: Vec<_> = (0..3).map(|_| admission.try_admit(Priority::Normal, Deadline::NONE).unwrap()).collect();
        assert!(
            admission.try_admit(Priority::Normal, Deadline::NONE).is_err(),
            "2 of 10 places are kept for high priority"
        );
        let high: Vec<_> = (0..2).map(|_| admission.try_admit(Priority::High, Deadline::NONE).unwrap()).collect();
        assert!(admission.try_admit(Priority::High, Deadline::NONE).is_err());
        assert_eq!(admission.in_flight(), 10);
        drop((low, normal, high));
        assert_eq!(admission.in_flight(), 0);
    }

    #[test]
    fn quotas_refuse_naming_themselves_and_give_back_places() {
        let metrics = Metrics::new();
        let team = Quota::new(
            "team 'search'".into(),
            "traffic.teams.search".into(),
            "team/search",
            &QuotaConfig { max_in_flight: Some(1), ..QuotaConfig::default() },
            &metrics,
        );
        let rate = Quota::new(
            "pipeline 'p'".into(),
            "pipelines[0].quota".into(),
            "pipeline/p",
            &QuotaConfig { requests_per_second: Some(1), burst: Some(2), max_in_flight: None },
            &metrics,
        );
        let a = admission(10, &TrafficConfig::default(), &Gauge::default()).with_quotas(vec![rate, team.clone()]);
        let first = a.try_admit(Priority::Normal, Deadline::NONE).unwrap();
        let err = a.try_admit(Priority::Normal, Deadline::NONE).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("team 'search' is over its quota of 1 requests at once"), "{err}");
        assert!(err.message().contains("traffic.teams.search.max_in_flight"), "{err}");
        assert_eq!(a.in_flight(), 1, "a refused request holds no place");
        drop(first);
        let _second = a.try_admit(Priority::Normal, Deadline::NONE).unwrap();
        drop(_second);
        // Burst of 2 spent (the refused one took none).
        let err = a.try_admit(Priority::Normal, Deadline::NONE).unwrap_err();
        assert!(err.message().contains("pipeline 'p' is over its quota of 1 requests per second, burst 2"), "{err}");
        assert_eq!(team.in_flight.load(Ordering::Acquire), 0, "a rate refusal gives the team's place back");
        let text = metrics.encode();
        assert!(text.contains(r#"queue="quota/team/search",reason="quota_in_flight""#), "{text}");
    }
}
