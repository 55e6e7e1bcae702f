//! `resume-storm`: a reconnect storm of `rapidws::client::Subscriber`s.
//! Each subscriber reaches the bus through a TCP proxy in this process;
//! after the warm-up (or at `--cut-at`, a wall-clock time, so that several
//! processes cut together) the proxy cuts every connection at once. Each
//! subscriber then reconnects after its own backoff (full jitter) and
//! resumes after its last delivery. The figures: how many recovered (a
//! delivery after the cut, every offset once and in order, no
//! discontinuity), when they reconnected (spread over the backoff window)
//! and when each had its first delivery again.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use rapidws::client::Subscriber;
use rapidws::client::subscriber::Event;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::emit;

#[derive(Args, Debug, Clone)]
pub struct ResumeStormArgs {
    /// The bus (notify_bus) address.
    #[arg(long, default_value = "127.0.0.1:9004")]
    pub addr: SocketAddr,
    /// Subscribers in this process (each is three descriptors here: keep
    /// under 6,000 a process).
    #[arg(long, default_value_t = 5_000)]
    pub subscribers: usize,
    /// The topic.
    #[arg(long, default_value = "storm")]
    pub topic: String,
    /// Publishes per second to the topic from this process (0: none; one
    /// process of a storm publishes).
    #[arg(long, default_value_t = 20)]
    pub rate: u64,
    /// Seconds before the cut (at least long enough for every subscriber
    /// to have a delivery).
    #[arg(long, default_value_t = 8.0)]
    pub warmup: f64,
    /// Cut at this wall-clock time (milliseconds since the Unix epoch)
    /// instead of after the warm-up.
    #[arg(long)]
    pub cut_at: Option<u64>,
    /// The most seconds given to recovering after the cut.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
}

/// What one subscriber saw.
#[derive(Default)]
struct Seen {
    /// The last offset delivered (one epoch: the bus keeps running).
    last: Option<u64>,
    deliveries: u64,
    /// Offsets skipped or repeated: both must stay 0.
    gaps: u64,
    repeats: u64,
    discontinuities: u64,
    /// After the cut: when it connected again, and had a delivery on that
    /// connection.
    reconnected: Option<Duration>,
    delivered_again: Option<Duration>,
}

pub async fn run(args: ResumeStormArgs) -> io::Result<()> {
    let (proxy, cut) = proxy(args.addr).await?;
    let url = format!("ws://{proxy}/ws");
    let cut_at: Rc<RefCell<Option<Instant>>> = Rc::default();
    let mut seen = Vec::with_capacity(args.subscribers);
    // One client for all, as an application holds one.
    let client = rapidws::client::Client::new(rapidws::Config::default());
    for _ in 0..args.subscribers {
        let one: Rc<RefCell<Seen>> = Rc::default();
        seen.push(one.clone());
        let mut subscriber = Subscriber::builder(url.as_str())
            .topics([args.topic.as_str()])
            .client(client.clone())
            .start();
        let cut_at = cut_at.clone();
        tokio::task::spawn_local(async move {
            while let Some(event) = subscriber.next().await {
                let since_cut = cut_at.borrow().map(|at| at.elapsed());
                let mut one = one.borrow_mut();
                match event {
                    Event::Delivery { position, .. } => {
                        match one.last {
                            Some(last) if position.offset <= last => one.repeats += 1,
                            Some(last) if position.offset > last + 1 => one.gaps += 1,
                            _ => {}
                        }
                        one.last = Some(position.offset);
                        one.deliveries += 1;
                        // Only a delivery on the connection made after the
                        // cut counts (not one that waited in the queue).
                        if let (Some(after), Some(_), None) =
                            (since_cut, one.reconnected, one.delivered_again)
                        {
                            one.delivered_again = Some(after);
                        }
                    }
                    Event::Discontinuity { .. } => one.discontinuities += 1,
                    Event::Connected => {
                        if let (Some(after), None) = (since_cut, one.reconnected) {
                            one.reconnected = Some(after);
                        }
                    }
                    _ => {}
                }
            }
        });
        // Connect a few hundred at a time, as a fleet that starts up would.
        if seen.len() % 500 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if args.rate > 0 {
        tokio::task::spawn_local(publish(args.addr, args.topic.clone(), args.rate));
    }
    match args.cut_at {
        Some(at) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let wait = Duration::from_millis(at).saturating_sub(now);
            tokio::time::sleep(wait).await;
        }
        None => tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await,
    }
    let ready = seen.iter().filter(|s| s.borrow().last.is_some()).count();
    emit(&json!({"event": "measure", "subscribers": args.subscribers, "with_a_delivery": ready}));
    *cut_at.borrow_mut() = Some(Instant::now());
    cut.send_modify(|n| *n += 1);
    let deadline = Instant::now() + Duration::from_secs_f64(args.duration);
    while Instant::now() < deadline {
        if seen.iter().all(|s| s.borrow().delivered_again.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen: Vec<_> = seen.iter().map(|s| s.borrow()).collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut reconnected: Vec<f64> = seen.iter().filter_map(|s| s.reconnected.map(ms)).collect();
    let mut again: Vec<f64> = seen
        .iter()
        .filter_map(|s| s.delivered_again.map(ms))
        .collect();
    let recovered = seen
        .iter()
        .filter(|s| {
            s.delivered_again.is_some() && s.gaps == 0 && s.repeats == 0 && s.discontinuities == 0
        })
        .count();
    emit(&json!({
        "mode": "resume-storm",
        "subscribers": args.subscribers,
        "with_a_delivery_before": ready,
        "recovered": recovered,
        "reconnected": reconnected.len(),
        "gaps": seen.iter().map(|s| s.gaps).sum::<u64>(),
        "repeats": seen.iter().map(|s| s.repeats).sum::<u64>(),
        "discontinuities": seen.iter().map(|s| s.discontinuities).sum::<u64>(),
        "deliveries": seen.iter().map(|s| s.deliveries).sum::<u64>(),
        "reconnect_ms": spread(&mut reconnected),
        "delivered_again_ms": spread(&mut again),
    }));
    Ok(())
}

/// The minimum, quartiles, 99th percentile and maximum.
fn spread(values: &mut [f64]) -> serde_json::Value {
    if values.is_empty() {
        return json!(null);
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((values.len() - 1) as f64 * q).round() as usize;
        (values[i] * 10.0).round() / 10.0
    };
    json!({"min": at(0.0), "p25": at(0.25), "p50": at(0.5), "p75": at(0.75), "p99": at(0.99), "max": at(1.0)})
}

/// A proxy to `upstream` on a free loopback port; a send on the watch cuts
/// every connection open then.
async fn proxy(upstream: SocketAddr) -> io::Result<(SocketAddr, watch::Sender<u64>)> {
    let listener = crate::ports::listener()?;
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    let (cut, cuts) = watch::channel(0u64);
    tokio::task::spawn_local(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let mut cuts = cuts.clone();
            cuts.mark_unchanged();
            tokio::task::spawn_local(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = cuts.changed() => {}
                }
            });
        }
    });
    Ok((addr, cut))
}

/// `POST /publish/<topic>` at `rate` a second over one keep-alive
/// connection (a new one when the bus ends it).
async fn publish(bus: SocketAddr, topic: String, rate: u64) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut n = 0u64;
    let mut connection: Option<tokio::io::BufReader<TcpStream>> = None;
    loop {
        tick.tick().await;
        if connection.is_none() {
            connection = TcpStream::connect(bus)
                .await
                .ok()
                .map(tokio::io::BufReader::new);
        }
        let Some(stream) = connection.as_mut() else {
            continue;
        };
        n += 1;
        let body = format!("m{n}");
        let head = format!(
            "POST /publish/{topic} HTTP/1.1\r\nHost: bus\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let written = stream.get_mut().write_all(head.as_bytes()).await;
        if written.is_err() || crate::fanout_http::answer(stream).await.is_err() {
            connection = None;
        }
    }
}
