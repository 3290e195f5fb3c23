//! The servers of one kind behind a `remote` plugin: which of them take work, the least
//! loaded of those, what each last said, and how long all of them have been gone.
//!
//! A server takes work once a probe (or a call) has found it reachable and, for generators,
//! holding the current weights. A call or probe that finds it dead takes it out; its own
//! probe brings it back when it answers again. When no server has taken work for longer than
//! the grace period, the fleet is gone for good: every call from then on fails at once with
//! the endpoints and what they last said. A server loading weights is alive, so the grace
//! period is then lengthened by the time one load may take (`weights_timeout_s`), but no
//! more: servers that answer their health checks yet fail, or never finish, every load do
//! not keep a run waiting for ever.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use areal_sdk::FaultStats;
use tokio::sync::Notify;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::security::SendToken;

/// One server.
pub(crate) struct Member<C> {
    pub(crate) url: String,
    pub(crate) client: C,
    in_flight: AtomicUsize,
    /// The most samples it is given at once; 0: no bound.
    capacity: AtomicUsize,
    state: Mutex<MemberState>,
}

#[derive(Clone, Debug)]
struct MemberState {
    /// Takes work.
    ready: bool,
    /// Alive but taking no work for now (loading weights): neither failed nor gone.
    loading: bool,
    /// Refused us for good (a wrong token, another protocol): waiting will not help.
    refused: bool,
    /// What it last said.
    said: String,
}

impl<C> Member<C> {
    /// Samples it has now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// The servers of one kind.
pub(crate) struct Fleet<C> {
    kind: &'static str,
    members: Vec<Member<C>>,
    grace: Duration,
    /// How long one weight load may take: added to the grace period while a server loads.
    load_time: Duration,
    changed: Notify,
    /// Since when no member has been ready; the verdict once that passed the grace period.
    gone: Mutex<(Option<Instant>, Option<FleetError>)>,
    routing: Routing,
    /// Where each recent sample went ([`Routing::Sticky`]).
    pins: Mutex<Pins>,
    next: AtomicUsize,
    reissued: AtomicU64,
    failures: AtomicU64,
}

/// A member lent to one call of `weight` samples; its load counts them until dropped.
pub(crate) struct Lease<'a, C> {
    pub(crate) index: usize,
    pub(crate) member: &'a Member<C>,
    pub(crate) weight: usize,
    fleet: &'a Fleet<C>,
}

impl<C> Lease<'_, C> {
    /// Keep the samples counted after the lease is gone: [`Fleet::release`] must give them
    /// back (a call that outlives its caller, on a task of its own).
    pub(crate) fn detach(self) -> (usize, usize) {
        let held = (self.index, self.weight);
        std::mem::forget(self);
        held
    }
}

impl<C> Drop for Lease<'_, C> {
    fn drop(&mut self) {
        self.fleet.release(self.index, self.weight);
    }
}

/// `message` as a request whose server must answer within `timeout`.
pub(crate) fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

pub(crate) fn default_connect_timeout_s() -> f64 {
    5.0
}

pub(crate) fn default_grace_s() -> f64 {
    60.0
}

pub(crate) fn default_probe_interval_s() -> f64 {
    0.5
}

/// HTTP/2 flow-control windows: the 64 KiB default makes a weight push wait for a round trip
/// every 64 KiB (0.06 GB/s on loopback).
pub(crate) const STREAM_WINDOW: u32 = 8 << 20;
/// The window of a whole connection (every stream on it).
pub(crate) const CONNECTION_WINDOW: u32 = 32 << 20;
/// Streams a client resets (a sample abandoned mid-way) that HTTP/2 remembers, so that what
/// the server had already sent on them is dropped quietly. A frame on a stream it has
/// forgotten (past h2's default of 50 in 30 s, which a fleet abandoning a batch passes) is
/// answered with a reset of its own, and h2 ends the connection at the 1 024th of those
/// (`locally-reset streams reached limit (1024)`, a connection to a healthy server lost on a
/// long run).
pub(crate) const REMEMBERED_RESETS: usize = 4096;
/// Streams a client may reset before the server has taken them (a batch abandoned at once)
/// before a server ends the connection: h2's default of 20, its guard against the "rapid
/// reset" flood, is less than one batch of a fleet's samples; this still bounds a flood.
pub(crate) const PENDING_ACCEPT_RESETS: usize = 1024;

pub(crate) use crate::errors::{CallError, OptionError};
use crate::errors::{EndpointError, FleetError, SampleError, SampleFailure};

/// How a client reaches its servers: the connection time-out, and for `https://` endpoints
/// the certificate authority that signed the servers' certificates (the same for gRPC and
/// HTTP: rustls over ring).
pub(crate) struct Connect {
    pub(crate) timeout: Duration,
    /// The authority's PEM, checked to hold at least one certificate.
    ca_pem: Option<Vec<u8>>,
}

impl Connect {
    /// `timeout`, and TLS trusting the PEM certificate authority in `ca_file` if given.
    pub(crate) fn new(
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, OptionError> {
        let ca_pem = ca_file
            .map(|path| {
                let pem = std::fs::read(path).map_err(|e| {
                    OptionError::caused("tls_ca_file", format!("cannot read {}", path.display()), e)
                })?;
                if certificates(&pem).is_none_or(|c| c.is_empty()) {
                    return Err(OptionError::new(
                        "tls_ca_file",
                        format!("{} holds no PEM certificate", path.display()),
                    ));
                }
                Ok(pem)
            })
            .transpose()?;
        Ok(Self { timeout, ca_pem })
    }

    /// The TLS settings of gRPC channels, when an authority is given.
    fn grpc_tls(&self) -> Option<tonic::transport::ClientTlsConfig> {
        self.ca_pem.as_ref().map(|pem| {
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        })
    }

    /// The TLS settings of HTTP clients: trusting the authority if given, nothing otherwise
    /// (an `https://` endpoint is then refused by [`check`](Self::check)).
    pub(crate) fn http_tls(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        let pem = self.ca_pem.as_deref().unwrap_or_default();
        for certificate in certificates(pem).unwrap_or_default() {
            // checked in `new`: a certificate rustls cannot use fails the handshake instead
            let _ = roots.add(certificate);
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth()
    }

    /// Refuse an endpoint this client cannot reach: not `http://` or `https://`, no host, or
    /// `https://` without an authority to trust.
    pub(crate) fn check(&self, given: &str) -> Result<(), EndpointError> {
        let url = redacted(given);
        let rest = if let Some(rest) = given.strip_prefix("https://") {
            if self.ca_pem.is_none() {
                return Err(EndpointError::NeedsAuthority { url });
            }
            rest
        } else if let Some(rest) = given.strip_prefix("http://") {
            rest
        } else {
            return Err(EndpointError::Scheme { url });
        };
        if rest.trim_end_matches('/').is_empty() {
            return Err(EndpointError::NoHost { url });
        }
        Ok(())
    }
}

/// The certificates of a PEM file; `None` if it does not parse.
fn certificates(pem: &[u8]) -> Option<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()
}

/// A lazily connecting channel to `url`; must be called inside a runtime.
pub(crate) fn channel(given: &str, connect: &Connect) -> Result<Channel, EndpointError> {
    connect.check(given)?;
    let invalid = |source: Box<dyn std::error::Error + Send + Sync>| EndpointError::Invalid {
        url: redacted(given),
        source,
    };
    let mut endpoint = Channel::from_shared(given.to_owned()).map_err(|e| invalid(Box::new(e)))?;
    if let Some(tls) = connect.grpc_tls().filter(|_| given.starts_with("https://")) {
        endpoint = endpoint.tls_config(tls).map_err(|e| invalid(Box::new(e)))?;
    }
    Ok(endpoint
        .connect_timeout(connect.timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_max_concurrent_reset_streams(REMEMBERED_RESETS)
        .connect_lazy())
}

/// A client runtime named `name` of `threads` threads, and a client per endpoint, made by
/// `client` on a lazily connecting channel that sends `token` with every call. The error names
/// the option at fault.
pub(crate) fn connect_all<C>(
    name: &str,
    threads: usize,
    endpoints: &[String],
    connect: &Connect,
    token: Option<&str>,
    client: impl Fn(InterceptedService<Channel, SendToken>) -> C,
) -> Result<(ClientRuntime, Vec<(String, C)>), OptionError> {
    let runtime = ClientRuntime::new(name, threads)?;
    let send_token = SendToken::new(token).map_err(|e| OptionError::new("endpoints", e))?;
    let members = {
        let _in_runtime = runtime.get().enter();
        endpoints
            .iter()
            .map(|url| {
                let channel = channel(url, connect)?;
                let guarded = InterceptedService::new(channel, send_token.clone());
                Ok((url.clone(), client(guarded)))
            })
            .collect::<Result<Vec<_>, EndpointError>>()?
    };
    Ok((runtime, members))
}

impl<C> Fleet<C> {
    /// Servers of `kind` ("generator", "reward"), none taking work until probed.
    pub(crate) fn new(kind: &'static str, members: Vec<(String, C)>, grace: Duration) -> Self {
        Self {
            kind,
            members: members
                .into_iter()
                .map(|(url, client)| Member {
                    url: redacted(&url),
                    client,
                    in_flight: AtomicUsize::new(0),
                    capacity: AtomicUsize::new(0),
                    state: Mutex::new(MemberState {
                        ready: false,
                        loading: false,
                        refused: false,
                        said: "not contacted yet".into(),
                    }),
                })
                .collect(),
            grace,
            load_time: Duration::ZERO,
            changed: Notify::new(),
            gone: Mutex::new((Some(Instant::now()), None)),
            routing: Routing::default(),
            pins: Mutex::new(Pins::default()),
            next: AtomicUsize::new(0),
            reissued: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// This fleet routes as `routing` says.
    pub(crate) fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// This fleet's servers load weights, each load taking at most `load_time`.
    pub(crate) fn with_load_time(mut self, load_time: Duration) -> Self {
        self.load_time = load_time;
        self
    }

    pub(crate) fn members(&self) -> &[Member<C>] {
        &self.members
    }

    fn state(&self, index: usize) -> std::sync::MutexGuard<'_, MemberState> {
        self.members[index].state.lock().expect("member lock")
    }

    /// Whether member `index` takes work.
    pub(crate) fn is_ready(&self, index: usize) -> bool {
        self.state(index).ready
    }

    /// Member `index` takes work (holding `held`, for generators).
    pub(crate) fn set_ready(&self, index: usize, held: Option<u64>) {
        {
            let mut s = self.state(index);
            if !s.ready {
                tracing::info!(target: "areal::remote", kind = self.kind, endpoint = %self.members[index].url, version = ?held, "server takes work");
            }
            *s = MemberState {
                ready: true,
                loading: false,
                refused: false,
                said: match held {
                    Some(version) => format!("ready, holding version {version}"),
                    None => "ready".into(),
                },
            };
        }
        self.update_gone();
    }

    /// Member `index` is reachable but takes no work for now (loading weights).
    pub(crate) fn set_busy(&self, index: usize, said: String) {
        {
            let mut s = self.state(index);
            s.ready = false;
            s.loading = true;
            s.said = said;
        }
        self.update_gone();
    }

    /// Member `index` failed; counted when it was taking work (or loading weights to).
    pub(crate) fn set_down(&self, index: usize, said: String) {
        let was_ready = {
            let mut s = self.state(index);
            let was = s.ready || s.loading;
            s.ready = false;
            s.loading = false;
            s.refused = false;
            s.said = said.clone();
            was
        };
        if was_ready {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "areal::remote", kind = self.kind, endpoint = %self.members[index].url, said, "server failed; its work goes elsewhere");
        }
        self.update_gone();
    }

    /// Member `index` refused us for good (a wrong token, another protocol).
    pub(crate) fn set_refused(&self, index: usize, said: String) {
        {
            let mut s = self.state(index);
            if !s.refused {
                tracing::error!(target: "areal::remote", kind = self.kind, endpoint = %self.members[index].url, said, "server refuses us");
            }
            s.ready = false;
            s.loading = false;
            s.refused = true;
            s.said = said;
        }
        self.update_gone();
    }

    /// Member `index` failed as `error` says: down for now, or refusing us for good.
    pub(crate) fn fail(&self, index: usize, error: CallError) {
        match error {
            CallError::Fault(said) => self.set_down(index, said),
            refused @ (CallError::Refused(_) | CallError::Unsupported(_)) => {
                self.set_refused(index, refused.to_string());
            }
        }
    }

    /// A sample was sent again after its server failed.
    pub(crate) fn count_reissue(&self) {
        self.reissued.fetch_add(1, Ordering::Relaxed);
    }

    /// What was lost so far.
    pub(crate) fn faults(&self) -> FaultStats {
        FaultStats::new(
            self.reissued.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }

    fn update_gone(&self) {
        // Loading is not taking work: the clock runs on (a load that fails, then another,
        // must not hold it back for ever); `acquire` lengthens the period by a load's time.
        let any_ready = (0..self.members.len()).any(|i| self.state(i).ready);
        {
            let mut gone = self.gone.lock().expect("gone lock");
            if any_ready {
                gone.0 = None;
            } else if gone.0.is_none() {
                gone.0 = Some(Instant::now());
            }
        }
        self.changed.notify_waiters();
    }

    /// Every endpoint with what it last said.
    pub(crate) fn report(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{} ({})", m.url, self.state(i).said))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Member `index` takes at most `capacity` samples at once (0: no bound).
    pub(crate) fn set_capacity(&self, index: usize, capacity: usize) {
        self.members[index]
            .capacity
            .store(capacity, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// `weight` samples of member `index` are done.
    pub(crate) fn release(&self, index: usize, weight: usize) {
        self.members[index]
            .in_flight
            .fetch_sub(weight, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// The member the routing picks for sample `sample_id` (with [`Routing::Sticky`], the one
    /// its earlier calls went to while that one takes work and has room), waiting for one
    /// while none takes work; an error once none has for the grace period (for good) or every
    /// one refuses us.
    pub(crate) async fn acquire_for(&self, sample_id: u64) -> Result<Lease<'_, C>, FleetError> {
        self.acquire_routed(1, Some(sample_id)).await
    }

    /// [`acquire_for`](Self::acquire_for) any sample, for up to `want` samples: the lease's weight is what the
    /// member picked has room for (its capacity less what it has), at least one. While every
    /// member that takes work is full, it waits for room.
    pub(crate) async fn acquire_up_to(&self, want: usize) -> Result<Lease<'_, C>, FleetError> {
        self.acquire_routed(want, None).await
    }

    async fn acquire_routed(
        &self,
        want: usize,
        sample_id: Option<u64>,
    ) -> Result<Lease<'_, C>, FleetError> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let deadline = {
                let mut gone = self.gone.lock().expect("gone lock");
                if let Some(verdict) = &gone.1 {
                    return Err(verdict.clone());
                }
                if let Some(lease) = self.route(want.max(1), sample_id) {
                    return Ok(lease);
                }
                if (0..self.members.len()).any(|i| self.state(i).ready) {
                    // busy, not gone: room comes back as calls end
                    None
                } else {
                    let refused = (0..self.members.len()).all(|i| self.state(i).refused);
                    if refused {
                        return Err(FleetError::AllRefuse {
                            kind: self.kind,
                            report: self.report(),
                        });
                    }
                    // a server loading weights is alive: a long load must not use up the grace
                    // period, but it gets one load's time, no more
                    let loading = (0..self.members.len()).any(|i| self.state(i).loading);
                    let period = if loading {
                        self.grace + self.load_time
                    } else {
                        self.grace
                    };
                    let since = *gone.0.get_or_insert_with(Instant::now);
                    let deadline = since + period;
                    if Instant::now() >= deadline {
                        let verdict = FleetError::Gone {
                            kind: self.kind,
                            seconds: period.as_secs_f64(),
                            with_load: loading,
                            report: self.report(),
                        };
                        tracing::error!(target: "areal::remote", kind = self.kind, %verdict, "giving up on the servers");
                        gone.1 = Some(verdict.clone());
                        return Err(verdict);
                    }
                    Some(deadline)
                }
            };
            match deadline {
                None => changed.await,
                Some(deadline) => tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(deadline.into()) => {}
                },
            }
        }
    }

    /// Run `call` for sample `sample_id` on the member the routing picks (after `before`, each
    /// time), given its index and client. A member that fails is taken out and the call goes once more to
    /// another; a refusal is final. The answer and the endpoint that gave it, or why there is
    /// none, naming every failure on the way.
    pub(crate) async fn call_reissuing_once<T, Before, Fut>(
        &self,
        sample_id: u64,
        mut before: impl FnMut() -> Before,
        mut call: impl FnMut(usize, C) -> Fut,
    ) -> Result<(T, String), SampleError>
    where
        C: Clone,
        Before: Future<Output = ()>,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let mut failures: Vec<String> = Vec::new();
        let why = loop {
            before().await;
            let lease = match self.acquire_for(sample_id).await {
                Ok(lease) => lease,
                Err(gone) => break SampleFailure::from(gone),
            };
            let url = lease.member.url.clone();
            match call(lease.index, lease.member.client.clone()).await {
                Ok(answer) => return Ok((answer, url)),
                Err(refusal @ (CallError::Refused(_) | CallError::Unsupported(_))) => {
                    break SampleFailure::Refused { url, refusal };
                }
                Err(CallError::Fault(said)) => {
                    tracing::debug!(target: "areal::remote", kind = self.kind, endpoint = %url, sample_id, said, "call failed; sending the sample elsewhere");
                    self.set_down(lease.index, said.clone());
                    failures.push(format!("{url}: {said}"));
                    if failures.len() > 1 {
                        // every failure is named in this one
                        let tried = std::mem::take(&mut failures);
                        break SampleFailure::NoneAnswered {
                            kind: self.kind,
                            tried,
                        };
                    }
                    self.count_reissue();
                }
            }
        };
        Err(SampleError {
            sample_id,
            why,
            failures,
        })
    }

    /// The member the routing policy picks among those that take work and have room, leased
    /// for up to `want` samples (of sample `sample_id`, when for one).
    fn route(&self, want: usize, sample_id: Option<u64>) -> Option<Lease<'_, C>> {
        let n = self.members.len();
        let room = |i: usize| match self.members[i].capacity.load(Ordering::Relaxed) {
            0 => want,
            capacity => capacity
                .saturating_sub(self.members[i].in_flight())
                .min(want),
        };
        let least_loaded = || {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
            let mut best: Option<(usize, usize)> = None;
            for k in 0..n {
                let i = (start + k) % n;
                if !self.state(i).ready || room(i) == 0 {
                    continue;
                }
                let load = self.members[i].in_flight();
                if best.is_none_or(|(_, b)| load < b) {
                    best = Some((i, load));
                }
            }
            best.map(|(i, _)| i)
        };
        let index = match (self.routing, sample_id) {
            (Routing::Sticky, Some(sample_id)) => {
                let mut pins = self.pins.lock().expect("pins lock");
                match pins.get(sample_id) {
                    Some(i) if i < n && self.state(i).ready && room(i) > 0 => i,
                    _ => {
                        let i = least_loaded()?;
                        pins.pin(sample_id, i);
                        i
                    }
                }
            }
            _ => least_loaded()?,
        };
        let weight = room(index);
        let member = &self.members[index];
        member.in_flight.fetch_add(weight, Ordering::Relaxed);
        Some(Lease {
            index,
            member,
            weight,
            fleet: self,
        })
    }
}

/// How a fleet picks the server of a call among those that take work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// The fewest calls in flight; ties taken in turn.
    #[default]
    LeastLoaded,
    /// Every call of a sample (an episode's turns, an agent session's, a sample continued
    /// after a weight update) to the server its first went to, while that one takes work and
    /// has room, so that its prefix cache holds the sample's tokens so far; a sample's first
    /// call, and one whose server is gone or full, to the least loaded.
    Sticky,
}

/// Where recent samples went: the last [`Pins::KEPT`] samples' servers.
#[derive(Default)]
struct Pins {
    to: std::collections::HashMap<u64, usize>,
    order: std::collections::VecDeque<u64>,
}

impl Pins {
    /// How many samples' servers are remembered (far more than are in flight at once).
    const KEPT: usize = 1 << 16;

    fn get(&self, sample_id: u64) -> Option<usize> {
        self.to.get(&sample_id).copied()
    }

    fn pin(&mut self, sample_id: u64, index: usize) {
        if self.to.insert(sample_id, index).is_none() {
            self.order.push_back(sample_id);
            if self.order.len() > Self::KEPT
                && let Some(old) = self.order.pop_front()
            {
                self.to.remove(&old);
            }
        }
    }
}

/// A tokio runtime of a client's own (its channels and probes), shut down without waiting
/// when dropped, so that dropping a plugin inside async code is safe.
pub(crate) struct ClientRuntime(Option<tokio::runtime::Runtime>);

impl ClientRuntime {
    pub(crate) fn new(name: &str, threads: usize) -> Result<Self, OptionError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_all()
            .build()
            .map(|r| Self(Some(r)))
            .map_err(|e| OptionError::caused("endpoints", "cannot start the client's runtime", e))
    }

    pub(crate) fn get(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("the runtime lives until dropped")
    }
}

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The pause of a generator fleet on this side: while it is closed, new samples wait here
/// before they are sent. Opening resumes the servers in the background (a sample that reaches
/// a server before its resume waits there for it), and the next close waits for that resume
/// first, so that a resume never lands after the pause that follows it.
pub(crate) struct PauseGate {
    paused: tokio::sync::watch::Sender<bool>,
    resuming: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PauseGate {
    pub(crate) fn new() -> Self {
        Self {
            paused: tokio::sync::watch::Sender::new(false),
            resuming: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether it is closed.
    pub(crate) fn is_closed(&self) -> bool {
        *self.paused.borrow()
    }

    /// Resolves once the gate is open.
    pub(crate) fn opened(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut paused = self.paused.subscribe();
        async move {
            let _ = paused.wait_for(|p| !*p).await;
        }
    }

    /// Close it, once a resume still running has ended.
    pub(crate) async fn close(&self) {
        if let Some(resuming) = self.resuming.lock().await.take() {
            let _ = resuming.await;
        }
        self.paused.send_replace(true);
    }

    /// Open it again without resuming anything (a pause that could not be made).
    pub(crate) fn reopen(&self) {
        self.paused.send_replace(false);
    }

    /// Open it, and resume the servers with `resume` on `runtime`, in the background.
    pub(crate) async fn open(
        &self,
        runtime: &tokio::runtime::Runtime,
        resume: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.paused.send_replace(false);
        *self.resuming.lock().await = Some(runtime.spawn(resume));
    }
}

/// Check the options both remote plugins share; the message names the key.
/// `url` as logs and errors show it: a password in it (`http://user:secret@host`) becomes
/// `***`. Calls use the URL as given; nothing that is printed does.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_owned(),
    }
}

pub(crate) fn check_options(
    endpoints: &[String],
    seconds: &[(&'static str, f64)],
) -> Result<(), OptionError> {
    if endpoints.is_empty() {
        return Err(OptionError::new(
            "endpoints",
            "give at least one endpoint, e.g. [\"http://127.0.0.1:50051\"]",
        ));
    }
    for (key, value) in seconds {
        if !(*value > 0.0 && *value <= 86_400.0) {
            return Err(OptionError::new(
                key,
                format!("must be between 0 and 86400 seconds, found {value}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Fleet, Routing, redacted};

    fn fleet(routing: Routing, n: usize) -> Fleet<()> {
        let members = (0..n).map(|i| (format!("http://s{i}"), ())).collect();
        let fleet = Fleet::new("generator", members, std::time::Duration::from_secs(1))
            .with_routing(routing);
        for i in 0..n {
            fleet.set_ready(i, None);
        }
        fleet
    }

    /// Sticky routing keeps each sample on the server its first call went to, spreads new
    /// samples by load, and moves a sample whose server is gone or full.
    #[test]
    fn sticky_routing_keeps_a_samples_calls_on_one_server() {
        let fleet = fleet(Routing::Sticky, 3);
        // 30 samples, each with a call in flight: spread 10 to a server
        let leases: Vec<_> = (0..30).map(|s| fleet.route(1, Some(s)).unwrap()).collect();
        let first: Vec<usize> = leases.iter().map(|l| l.index).collect();
        for i in 0..3 {
            assert_eq!(first.iter().filter(|&&x| x == i).count(), 10);
        }
        drop(leases);
        // every later call of a sample goes where its first did, whatever the load
        for round in 0..4 {
            let again: Vec<usize> = (0..30)
                .map(|s| fleet.route(1, Some(s)).unwrap().index)
                .collect();
            assert_eq!(again, first, "round {round}");
        }
        // a server gone: its samples move once, and stay where they moved
        fleet.set_down(0, "gone".into());
        let moved: Vec<usize> = (0..30)
            .map(|s| fleet.route(1, Some(s)).unwrap().index)
            .collect();
        for (s, (&before, &after)) in first.iter().zip(&moved).enumerate() {
            if before == 0 {
                assert_ne!(after, 0, "sample {s}");
            } else {
                assert_eq!(after, before, "sample {s}");
            }
        }
        fleet.set_ready(0, None);
        let back: Vec<usize> = (0..30)
            .map(|s| fleet.route(1, Some(s)).unwrap().index)
            .collect();
        assert_eq!(back, moved, "a sample stays where it moved");
        // a full server: its sample goes elsewhere, and stays there
        let pinned_to_1 = (0..30).find(|&s| moved[s as usize] == 1).unwrap();
        let hold = fleet.route(1, Some(pinned_to_1)).unwrap();
        assert_eq!(hold.index, 1);
        fleet.set_capacity(1, 1);
        let elsewhere = fleet.route(1, Some(pinned_to_1)).unwrap().index;
        assert_ne!(elsewhere, 1);
        drop(hold);
        assert_eq!(fleet.route(1, Some(pinned_to_1)).unwrap().index, elsewhere);
        // least-loaded routing ignores the sample
        let fleet = super::tests::fleet(Routing::LeastLoaded, 2);
        let a = fleet.route(1, Some(7)).unwrap();
        let b = fleet.route(1, Some(7)).unwrap();
        assert_ne!(a.index, b.index);
    }

    /// Issue 32: a password in an endpoint URL was echoed in logs and errors.
    #[test]
    fn passwords_in_urls_are_never_shown() {
        assert_eq!(
            redacted("http://trainer:s3cret@10.0.0.5:30000/generate?x=1"),
            "http://trainer:***@10.0.0.5:30000/generate?x=1"
        );
        assert_eq!(redacted("https://token@host"), "https://token:***@host");
        assert_eq!(redacted("http://host:1/a@b"), "http://host:1/a@b");
        assert_eq!(redacted("http://127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(redacted("not a url"), "not a url");
    }
}
