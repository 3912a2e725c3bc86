//! Burst benchmark: how fast pods are admitted into a namespace with no admission,
//! one with Kubernetes' ResourceQuota, and one behind card-quota, posted N at a time
//! the way a Job controller or a script posts them. The cases run interleaved
//! (A B C A B C) so drift in the machine's load hits all of them alike.
//!
//!   cargo run --release --example burst -- --pods 2000 --concurrency 16 --rounds 2 \
//!     --case plain=ns-a --case resourcequota=ns-b --case card-quota=ns-c --queue q
//!
//! Pods request one `nvidia.com/gpu`, name `--card` and the queue, and use the
//! `volcano` scheduler so that nothing binds them: pending pods count against both
//! quotas. Every round deletes its pods (and waits until they are gone) before the next.

use std::time::{Duration, Instant};

use clap::Parser;
use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Pods per case and round.
    #[arg(long, default_value_t = 2000)]
    pods: usize,
    /// Creations in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// label=namespace, in the order the cases run. The case labelled
    /// `webhook-no-cards` posts pods without card requests (the webhook's fixed cost).
    #[arg(long = "case", required = true)]
    cases: Vec<String>,
    /// The Volcano queue the pods name.
    #[arg(long)]
    queue: String,
    #[arg(long, default_value = "RTX-4090")]
    card: String,
    /// spec.schedulerName of the pods (a name no scheduler runs keeps them pending
    /// beside a real Volcano, whose scheduler would bind `volcano` pods).
    #[arg(long, default_value = "volcano")]
    scheduler_name: String,
    /// Keep the last round's pods (to inspect usage afterwards).
    #[arg(long)]
    keep: bool,
    /// Run the cases at the same time (one burst split over namespaces), each with
    /// its own `--pods` and `--concurrency`, instead of one after the other.
    #[arg(long)]
    together: bool,
    /// Leave pods of an earlier run in place (the burst goes on).
    #[arg(long)]
    append: bool,
    /// Retry a creation the API server itself timed out ("ServerTimeout: please try
    /// again", as controllers do), up to 5 times; such retries are counted, not
    /// reported as errors. (A timed-out creation may still have happened: use only
    /// where counts need not be exact.)
    #[arg(long)]
    retry_server_timeouts: bool,
    /// name=PID of a process on this host whose CPU time each case is charged with
    /// (repeatable; processes of one name are added up). Printed per pod with the
    /// host's busy share: on a host whose cores are all busy, pods/s follows the CPU
    /// each pod costs.
    #[arg(long = "cpu")]
    cpu: Vec<String>,
}

/// CPU seconds a process has used (user + system, all its threads), from /proc.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) closed by the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // /proc counts in USER_HZ, 100 on Linux.
    Some(ticks / 100.0)
}

/// (busy, all) CPU seconds of the whole host so far, from /proc/stat.
fn host_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: f64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some(((all - idle) / 100.0, all / 100.0))
}

/// CPU seconds so far of each of `names` (the processes of `procs` added up by name,
/// [`names_of`]), then the host's busy and total.
fn cpu_now(procs: &[(String, u32)], names: &[String]) -> (Vec<f64>, (f64, f64)) {
    let mut by_name = vec![0.0; names.len()];
    for (name, pid) in procs {
        match (names.iter().position(|n| n == name), cpu_seconds(*pid)) {
            (Some(i), Some(s)) => by_name[i] += s,
            // Its share would read as nothing: say so rather than print a low number.
            _ => eprintln!("--cpu {name}={pid}: /proc/{pid}/stat cannot be read (process gone?)"),
        }
    }
    (by_name, host_seconds().unwrap_or_default())
}

fn names_of(procs: &[(String, u32)]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (n, _) in procs {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names
}

struct Outcome {
    admitted: usize,
    refused: usize,
    errors: usize,
    first_refusal: Option<String>,
    first_error: Option<String>,
    seconds: f64,
    /// Creation latency (the API server's answer, webhooks included) per pod.
    p50_ms: f64,
    p99_ms: f64,
}

fn pod(args: &Args, cards: bool) -> Pod {
    let (queue, card, scheduler) = (&args.queue, &args.card, &args.scheduler_name);
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"labels": {"card-quota-burst": "1"},
            "annotations": {"scheduling.volcano.sh/queue-name": queue, "volcano.sh/card.name": card}},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    if !cards {
        // The webhook's own cost: same path, nothing to charge.
        p["spec"]["containers"][0]["resources"] = json!({});
        p["metadata"]["annotations"] = json!({"scheduling.volcano.sh/queue-name": queue});
    }
    serde_json::from_value(p).expect("a valid Pod")
}

/// A name no other pod of this process or of an earlier run has. Not `generateName`:
/// its five random characters collide in a few percent of thousand-pod bursts into
/// one namespace, and the API server (before 1.31 by default) then fails it with 409
/// after the webhooks admitted it, an error that is neither card-quota's nor the
/// burst's to count.
fn unique_name() -> String {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        (nanos ^ (u64::from(std::process::id()) << 32)) & 0xffff_ffff_ffff
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("burst-{run:012x}-{n}")
}

async fn burst(api: &Api<Pod>, args: &Args, cards: bool) -> Outcome {
    let template = pod(args, cards);
    let start = Instant::now();
    let results: Vec<(Result<Pod, kube::Error>, Duration)> = stream::iter(0..args.pods)
        .map(|_| {
            let mut p = template.clone();
            let retry = args.retry_server_timeouts;
            async move {
                let mut attempt = 0;
                let sent = Instant::now();
                let result = loop {
                    // A new name for a retry too, as generateName would give: the
                    // timed-out creation may have happened under the first one.
                    p.metadata.name = Some(unique_name());
                    match api.create(&PostParams::default(), &p).await {
                        Err(kube::Error::Api(s))
                            if retry && s.reason == "ServerTimeout" && attempt < 5 =>
                        {
                            attempt += 1;
                            eprintln!("API server timeout (not a webhook answer); retry {attempt}");
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        }
                        other => break other,
                    }
                };
                (result, sent.elapsed())
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let seconds = start.elapsed().as_secs_f64();
    let mut latencies: Vec<f64> = results.iter().map(|(_, d)| d.as_secs_f64() * 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    let mut out = Outcome {
        admitted: 0,
        refused: 0,
        errors: 0,
        first_refusal: None,
        first_error: None,
        seconds,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
    };
    for (r, _) in results {
        match r {
            Ok(_) => out.admitted += 1,
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 400 || s.code == 429 => {
                out.refused += 1;
                out.first_refusal.get_or_insert(s.message);
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert(e.to_string());
            }
        }
    }
    out
}

async fn clear(api: &Api<Pod>) -> anyhow::Result<()> {
    let lp = ListParams::default().labels("card-quota-burst=1");
    api.delete_collection(&DeleteParams::default(), &lp).await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !api.list_metadata(&lp).await?.items.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "burst pods still exist after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// The `q` quantile of sorted `v` (nearest rank).
fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let cases: Vec<(String, Api<Pod>)> = args
        .cases
        .iter()
        .map(|c| {
            let (label, ns) = c
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--case {c:?}: expected label=namespace"))?;
            Ok((label.to_string(), Api::namespaced(client.clone(), ns)))
        })
        .collect::<anyhow::Result<_>>()?;
    if !args.append {
        for (_, api) in &cases {
            clear(api).await?;
        }
    }
    if args.together {
        let t = Instant::now();
        let outs = futures::future::join_all(
            cases
                .iter()
                .map(|(label, api)| burst(api, &args, label != "webhook-no-cards")),
        )
        .await;
        let secs = t.elapsed().as_secs_f64();
        let (mut admitted, mut refused, mut errors) = (0, 0, 0);
        for ((label, _), o) in cases.iter().zip(&outs) {
            println!(
                "{label}: admitted={} refused={} errors={}",
                o.admitted, o.refused, o.errors
            );
            if let Some(m) = &o.first_refusal {
                println!("{label}: first refusal: {m}");
            }
            if let Some(m) = &o.first_error {
                println!("{label}: first error: {m}");
            }
            admitted += o.admitted;
            refused += o.refused;
            errors += o.errors;
        }
        println!(
            "TOTAL admitted={admitted} refused={refused} errors={errors} seconds={secs:.1} pods/s={:.1}",
            (admitted + refused + errors) as f64 / secs
        );
        if !args.keep {
            for (_, api) in &cases {
                clear(api).await?;
            }
        }
        return Ok(());
    }
    let procs: Vec<(String, u32)> = args
        .cpu
        .iter()
        .map(|c| {
            let (name, pid) = c
                .split_once('=')
                .and_then(|(n, p)| Some((n.to_string(), p.parse().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--cpu {c:?}: expected name=PID"))?;
            Ok((name, pid))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let procs = match procs.is_empty() {
        true => procs,
        // This client's own share too.
        false => [procs, vec![("burst".to_string(), std::process::id())]].concat(),
    };
    let names = names_of(&procs);
    // Per case: each round's CPU milliseconds per pod of every named process, and the
    // host's busy share.
    let mut cpu: Vec<Vec<Vec<f64>>> = vec![Vec::new(); cases.len()];
    let mut busy: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut p99s: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    println!(
        "{} pods per case and round, {} at a time, {} rounds",
        args.pods, args.concurrency, args.rounds
    );
    println!("round  case            pods/s  admitted  refused  errors  seconds  p50 ms  p99 ms");
    for round in 1..=args.rounds {
        for (i, (label, api)) in cases.iter().enumerate() {
            let before = cpu_now(&procs, &names);
            let o = burst(api, &args, label != "webhook-no-cards").await;
            let after = cpu_now(&procs, &names);
            let pods = (o.admitted + o.refused + o.errors).max(1) as f64;
            cpu[i].push(
                after
                    .0
                    .iter()
                    .zip(&before.0)
                    .map(|(a, b)| 1000.0 * (a - b) / pods)
                    .collect(),
            );
            let all = after.1 .1 - before.1 .1;
            if all > 0.0 {
                busy[i].push((after.1 .0 - before.1 .0) / all);
            }
            let rate = (o.admitted + o.refused) as f64 / o.seconds;
            rates[i].push(rate);
            p50s[i].push(o.p50_ms);
            p99s[i].push(o.p99_ms);
            println!(
                "{round:>5}  {label:<14} {rate:>7.1}  {:>8}  {:>7}  {:>6}  {:>7.1}  {:>6.1}  {:>6.1}",
                o.admitted, o.refused, o.errors, o.seconds, o.p50_ms, o.p99_ms
            );
            if let Some(m) = &o.first_refusal {
                println!("       first refusal: {m}");
            }
            if let Some(m) = &o.first_error {
                println!("       first error: {m}");
            }
            if !(args.keep && round == args.rounds) {
                clear(api).await?;
            }
        }
    }
    println!("median pods/s:");
    let base = rates.iter().map(|r| median(r.clone())).collect::<Vec<_>>();
    for (i, (label, _)) in cases.iter().enumerate() {
        let ratio = base
            .iter()
            .zip(&cases)
            .find(|(_, (l, _))| l == "resourcequota")
            .map(|(b, _)| format!("  ({:.2}x resourcequota)", base[i] / b))
            .unwrap_or_default();
        println!(
            "  {label:<14} {:>7.1}{ratio}  p50 {:.1} ms  p99 {:.1} ms",
            base[i],
            median(p50s[i].clone()),
            median(p99s[i].clone())
        );
    }
    if !procs.is_empty() {
        println!("CPU per pod during each case (ms, median of rounds), and how busy the host was:");
        println!(
            "  {:<14} {}  host busy",
            "case",
            names
                .iter()
                .map(|n| format!("{n:>14}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        for (i, (label, _)) in cases.iter().enumerate() {
            let per: Vec<String> = (0..names.len())
                .map(|j| format!("{:>14.3}", median(cpu[i].iter().map(|r| r[j]).collect())))
                .collect();
            println!(
                "  {label:<14} {}  {:>8.0}%",
                per.join(" "),
                100.0 * median(busy[i].clone())
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_cpu_time_is_read_from_proc_and_grows_with_work() {
        let me = std::process::id();
        let before = cpu_seconds(me).expect("this process's /proc stat reads");
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu_seconds(me).expect("reads again");
        assert!(
            after - before >= 0.1,
            "{before} -> {after} after 0.3 s of work"
        );
        let (busy, all) = host_seconds().expect("/proc/stat reads");
        assert!(busy > 0.0 && busy <= all, "{busy} of {all}");
        assert!(cpu_seconds(u32::MAX).is_none());
    }

    #[test]
    fn processes_of_one_name_are_added_up_in_the_order_first_named() {
        let procs = [
            ("card-quota".to_string(), 1),
            ("floor".to_string(), 2),
            ("card-quota".to_string(), 3),
        ];
        assert_eq!(names_of(&procs), ["card-quota", "floor"]);
    }
}
