//! Courier's benchmark suite, held against PostgreSQL's own durable-commit budget measured
//! in the same run: `pgbench -N` TPS, submit throughput through the real HTTP/GraphQL stack,
//! drain throughput of one `courier serve`, submit-to-arrival latency, and peak RSS.
//!
//! Run: `cargo bench --bench throughput` (PostgreSQL at `TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Tunables: `BENCH_PENDING` (5000),
//! `BENCH_SECONDS` (10), `BENCH_CONNECTIONS` (32), `BENCH_LATENCY_SAMPLES` (100),
//! `BENCH_WORKER_CONCURRENCY` (128, the drain process's `COURIER_WORKER_CONCURRENCY`);
//! `BENCH_SUBMIT_ONLY=1` measures pgbench and then submit three times, nothing else;
//! `BENCH_PUBLISH_ONLY=1` measures pgbench and `publish` to 300 subscribed endpoints.
//! Results are printed and written to `target/courier-bench.json`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod pgbench;
mod process;
mod receiver;
mod workloads;

use std::time::Duration;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let mut server = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    // pgbench and Courier connect alike; on loopback, without TLS unless the URL says otherwise.
    if !server.contains("sslmode=") {
        server.push_str(if server.contains('?') {
            "&sslmode=disable"
        } else {
            "?sslmode=disable"
        });
    }
    let seconds = env_or("BENCH_SECONDS", 10u64);
    let pending = env_or("BENCH_PENDING", 5_000usize);
    let connections = env_or("BENCH_CONNECTIONS", 32usize);
    let samples = env_or("BENCH_LATENCY_SAMPLES", 100usize);
    let _ = rustls::crypto::ring::default_provider().install_default();

    println!("machine: {} cores, {}", num_cpus(), memory());
    let pgbench_tps = pgbench::tps(&server, Duration::from_secs(seconds)).await;
    println!("pgbench -N -c 8 -j 2: {pgbench_tps:.0} TPS");

    if std::env::var("BENCH_PUBLISH_ONLY").is_ok() {
        let publish = workloads::publish_fanout(&server, 300, 20).await;
        println!(
            "publish to {} endpoints: p50 {:.1} ms, max {:.1} ms",
            publish.endpoints, publish.p50_ms, publish.max_ms
        );
        return;
    }

    if std::env::var("BENCH_SUBMIT_ONLY").is_ok() {
        for _ in 0..3 {
            let submit =
                workloads::submit_throughput(&server, connections, Duration::from_secs(seconds))
                    .await;
            println!(
                "submit: {:.0}/s ({:.2}x pgbench)",
                submit.per_second,
                submit.per_second / pgbench_tps
            );
        }
        return;
    }

    let submit =
        workloads::submit_throughput(&server, connections, Duration::from_secs(seconds)).await;
    println!(
        "submit: {:.0}/s over {connections} connections ({:.2}x pgbench), {} errors",
        submit.per_second,
        submit.per_second / pgbench_tps,
        submit.errors
    );

    let drain = workloads::drain_throughput(&server, pending).await;
    println!(
        "drain: {} deliveries in {:.2}s = {:.0}/s ({:.2}x pgbench), peak RSS {:.1} MB",
        pending,
        drain.elapsed.as_secs_f64(),
        drain.per_second,
        drain.per_second / pgbench_tps,
        drain.peak_rss_mb
    );

    let latency = workloads::latency(&server, samples).await;
    println!(
        "submit-to-arrival over {samples} deliveries: p50 {:.2} ms, p99 {:.2} ms",
        latency.p50_ms, latency.p99_ms
    );

    let publish = workloads::publish_fanout(&server, 300, 20).await;
    println!(
        "publish to {} endpoints: p50 {:.1} ms, max {:.1} ms",
        publish.endpoints, publish.p50_ms, publish.max_ms
    );

    let results = serde_json::json!({
        "machine": { "cores": num_cpus(), "memory": memory() },
        "pgbench_tps": pgbench_tps,
        "submit_per_second": submit.per_second,
        "submit_ratio": submit.per_second / pgbench_tps,
        "submit_errors": submit.errors,
        "drain_deliveries": pending,
        "drain_per_second": drain.per_second,
        "drain_ratio": drain.per_second / pgbench_tps,
        "drain_peak_rss_mb": drain.peak_rss_mb,
        "latency_p50_ms": latency.p50_ms,
        "latency_p99_ms": latency.p99_ms,
        "publish_300_p50_ms": publish.p50_ms,
        "publish_300_max_ms": publish.max_ms,
    });
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/target/courier-bench.json");
    std::fs::write(path, serde_json::to_string_pretty(&results).unwrap()).unwrap();
    println!("written to {path}");
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn memory() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .next()
                .map(|line| line.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{} GiB", kb / 1024 / 1024))
        .unwrap_or_default()
}
