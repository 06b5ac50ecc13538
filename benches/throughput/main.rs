//! Courier's benchmark suite, measured the way users run Courier and held against
//! PostgreSQL's own durable-commit budget measured in the same run (`pgbench -N`):
//! submit throughput through the real HTTP/GraphQL stack (and, when asked for, the
//! instructions a submit costs the API process, counted by valgrind's callgrind: the same
//! on a busy machine); the drain of backlogs built
//! through the API (never seeded by SQL) by one `courier serve` with default settings,
//! start-up included, with per-10k-slice rates and peak RSS; submit-to-arrival latency
//! from the first request after the process reports ready; a fast endpoint's latency beside a
//! slow or hanging neighbour with a backlog; `publish` fan-out; and a bulk replay of an
//! endpoint's failed backlog beside other endpoints' drain.
//!
//! Run: `cargo bench --bench throughput` (PostgreSQL at `TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Tunables: `BENCH_SECONDS` (10, for
//! pgbench and submit), `BENCH_CONNECTIONS` (32, for submit and for building backlogs),
//! `BENCH_BACKLOGS` (`10000,100000`: the drains measured, each to one endpoint),
//! `BENCH_SPREAD` (50: the largest backlog is drained again spread over this many
//! endpoints; 1 skips it), `BENCH_KEYED` (`100000,10,1000`: a backlog drained over
//! endpoints and ordering keys, round robin, after the same backlog over the same endpoints
//! without keys; 0 skips both), `BENCH_LATENCY_SAMPLES` (300), `BENCH_ONLY` (a comma-separated
//! subset of `submit,drain,latency,neighbours,publish,replay,retention,history,tenants,tracing,hygiene`, or `instructions`, which runs only when named; pgbench always runs),
//! `BENCH_TENANT_ENDPOINTS` (`50,2000`: the tenants whose portal pages are timed),
//! `BENCH_TENANT_DELIVERIES` (40000: deliveries submitted beside each, half to the tenant),
//! `BENCH_REPLAY` (100000: failed deliveries replayed in bulk, twice), `BENCH_HISTORY`
//! (500000: expired deliveries retention prunes), `BENCH_RETENTION_BACKLOG` (100000: the
//! backlog drained while it prunes), `BENCH_HISTORY_SIZES` (`100000,10000000`:
//! the histories the operator's queries are timed against). `courier serve` processes inherit the environment, so `COURIER_*`
//! variables set for a run change their settings (the figures in the README use none).
//! `BENCH_BESIDE_SECONDS` (5: pgbench again right before submit, each drain and the latency
//! samples, each set beside its own; each also reports the share of the machine's CPU time
//! its host took, on a virtual machine). `BENCH_KEEP=1` keeps the scratch databases (their URLs are printed) for inspection.
//! Results are printed and written to `target/courier-bench.json`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod drain;
mod history;
mod hygiene;
mod instructions;
mod neighbours;
mod pgbench;
mod process;
mod receiver;
mod replay;
mod retention;
mod tenants;
mod tracing;
mod workloads;

use std::time::Duration;

use serde_json::json;

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
    let connections = env_or("BENCH_CONNECTIONS", 32usize);
    let samples = env_or("BENCH_LATENCY_SAMPLES", 300usize);
    let backlogs: Vec<usize> = std::env::var("BENCH_BACKLOGS")
        .unwrap_or_else(|_| "10000,100000".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let spread = env_or("BENCH_SPREAD", 50usize);
    let keyed: (usize, usize, usize) = {
        let figures: Vec<usize> = std::env::var("BENCH_KEYED")
            .unwrap_or_else(|_| "100000,10,1000".to_owned())
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        match figures[..] {
            [backlog, endpoints, keys] => (backlog, endpoints.max(1), keys),
            _ => (0, 1, 0),
        }
    };
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let runs = |part: &str| only.is_empty() || only.split(',').any(|p| p.trim() == part);
    let _ = rustls::crypto::ring::default_provider().install_default();

    println!("machine: {} cores, {}", num_cpus(), memory());
    let pgbench = pgbench::Pgbench::open(&server).await;
    let budget = pgbench.budget(Duration::from_secs(seconds));
    let pgbench_tps = budget.tps;
    // The budget again right before a part, where the part is set beside it.
    let beside = Duration::from_secs(env_or("BENCH_BESIDE_SECONDS", 5u64));
    println!("pgbench -N -c 8 -j 2 -T {seconds}: {pgbench_tps:.0} TPS");
    println!(
        "pgbench -N -c 1 -T 5: {:.2} ms a transaction (one commit and its statements)",
        budget.one_client_ms
    );
    let mut results = json!({
        "machine": { "cores": num_cpus(), "memory": memory() },
        "pgbench_tps": pgbench_tps,
        "pgbench_one_client_ms": budget.one_client_ms,
    });

    if runs("submit") {
        let tps_beside = pgbench.tps(beside);
        let host = process::HostTicks::now();
        let submit =
            workloads::submit_throughput(&server, connections, Duration::from_secs(seconds)).await;
        let stolen = host.stolen_percent();
        println!(
            "submit: {:.0}/s over {connections} connections ({:.2}x pgbench; {:.2}x the \
             {tps_beside:.0} TPS it measured just before), {} errors, courier CPU {:.0} us per \
             submit, {stolen:.0}% of the machine's CPU time taken by its host",
            submit.per_second,
            submit.per_second / pgbench_tps,
            submit.per_second / tps_beside,
            submit.errors,
            submit.cpu_us_per_submit
        );
        results["submit_per_second"] = json!(submit.per_second);
        results["submit_cpu_us"] = json!(submit.cpu_us_per_submit);
        results["submit_ratio"] = json!(submit.per_second / pgbench_tps);
        results["submit_pgbench_beside_tps"] = json!(tps_beside);
        results["submit_ratio_beside"] = json!(submit.per_second / tps_beside);
        results["submit_host_steal_percent"] = json!(stolen);
        results["submit_errors"] = json!(submit.errors);
    }

    // Only when asked for by name: it runs the server under valgrind, fifty times slower.
    if only.split(',').any(|part| part.trim() == "instructions") {
        if let Some(counted) = instructions::per_submit(&server, 2_000, connections).await {
            let per_submit = counted.total as f64 / counted.submits as f64;
            println!(
                "instructions per submit (callgrind, API only, {} submits over {connections} \
                 connections): {:.0} thousand ({:.1} million idle over as long, taken off)",
                counted.submits,
                per_submit / 1e3,
                counted.idle as f64 / 1e6
            );
            results["submit_instructions"] = json!(per_submit);
        }
    }

    if runs("drain") {
        let mut drains = Vec::new();
        // Every backlog to one endpoint, then the largest spread over `spread` endpoints.
        // Then, unless `BENCH_KEYED` is 0, a backlog spread over ordering keys.
        let mut runs: Vec<(usize, usize, usize)> = backlogs.iter().map(|&b| (b, 1, 0)).collect();
        if let Some(&largest) = backlogs.iter().max() {
            if spread > 1 {
                runs.push((largest, spread, 0));
            }
        }
        if keyed.0 > 0 {
            // The same backlog over the same endpoints without keys first: what ordering costs.
            runs.push((keyed.0, keyed.1, 0));
            runs.push(keyed);
        }
        for (backlog, endpoints, keys) in runs {
            let budget = || pgbench.tps(beside);
            let drain = drain::drain(&server, backlog, connections, endpoints, keys, &budget).await;
            let tps_beside = drain.pgbench_beside_tps.unwrap_or(f64::NAN);
            let fill = &drain.fill;
            println!(
                "backlog of {} built through the API over {connections} connections in {:.1} s \
                 ({:.0}/s, {} retried)",
                fill.submissions,
                fill.elapsed.as_secs_f64(),
                fill.per_second,
                fill.retried
            );
            let slices: Vec<String> = drain.slices.iter().map(|r| format!("{r:.0}")).collect();
            let over_keys = if drain.keys > 0 {
                format!(" and {} ordering keys", drain.keys)
            } else {
                String::new()
            };
            println!(
                "drain of {} over {} endpoint(s){over_keys}: {:.2} s from spawn = {:.0}/s ({:.2}x pgbench; \
                 {:.2}x the {tps_beside:.0} TPS it measured just before), \
                 per {}-slice: [{}] /s, peak RSS {:.1} MB, {} updates ({} HOT)",
                drain.backlog,
                drain.endpoints,
                drain.elapsed.as_secs_f64(),
                drain.per_second,
                drain.per_second / pgbench_tps,
                drain.per_second / tps_beside,
                drain::SLICE,
                slices.join(", "),
                drain.peak_rss_mb,
                drain.updates,
                drain.hot_updates
            );
            println!(
                "  CPU during the drain: courier {:.2} s, its PostgreSQL backends {:.2} s, \
                 receiver {:.2} s; {:.0}% of the machine's CPU time taken by its host",
                drain.cpu_courier, drain.cpu_postgres, drain.cpu_receiver, drain.host_steal_percent
            );
            drains.push(json!({
                "backlog": drain.backlog,
                "endpoints": drain.endpoints,
                "ordering_keys": drain.keys,
                "fill_seconds": fill.elapsed.as_secs_f64(),
                "fill_per_second": fill.per_second,
                "seconds": drain.elapsed.as_secs_f64(),
                "per_second": drain.per_second,
                "ratio": drain.per_second / pgbench_tps,
                "pgbench_beside_tps": tps_beside,
                "ratio_beside": drain.per_second / tps_beside,
                "host_steal_percent": drain.host_steal_percent,
                "slices_per_second": drain.slices,
                "peak_rss_mb": drain.peak_rss_mb,
                "updates": drain.updates,
                "hot_updates": drain.hot_updates,
                "cpu_seconds": { "courier": drain.cpu_courier, "postgres_backends": drain.cpu_postgres, "receiver": drain.cpu_receiver },
            }));
        }
        results["drains"] = json!(drains);
    }

    if runs("latency") {
        let one_client_beside = pgbench.one_client_ms(beside);
        let host = process::HostTicks::now();
        let latency = workloads::latency(&server, samples).await;
        let stolen = host.stolen_percent();
        let first: Vec<String> = latency
            .first_ms
            .iter()
            .map(|ms| format!("{ms:.1}"))
            .collect();
        println!(
            "submit-to-arrival over {samples} submissions from ready: p50 {:.2} ms, p99 {:.2} ms, \
             max {:.2} ms (answer-to-arrival p50 {:.2} ms, p99 {:.2} ms); first five [{}] ms; \
             {} claimed at submit; an authenticated `{{ __typename }}` between them, p50 {:.2} ms; \
             one client's pgbench transaction just before {one_client_beside:.2} ms; {stolen:.0}% \
             of the machine's CPU time taken by its host",
            latency.p50_ms,
            latency.p99_ms,
            latency.max_ms,
            latency.answered_p50_ms,
            latency.answered_p99_ms,
            first.join(", "),
            latency.claimed_at_submit,
            latency.trivial_p50_ms
        );
        results["latency_trivial_query_p50_ms"] = json!(latency.trivial_p50_ms);
        results["latency_p50_ms"] = json!(latency.p50_ms);
        results["latency_p99_ms"] = json!(latency.p99_ms);
        results["latency_max_ms"] = json!(latency.max_ms);
        results["latency_answered_p50_ms"] = json!(latency.answered_p50_ms);
        results["latency_answered_p99_ms"] = json!(latency.answered_p99_ms);
        results["latency_first_ms"] = json!(latency.first_ms);
        results["latency_pgbench_one_client_beside_ms"] = json!(one_client_beside);
        results["latency_host_steal_percent"] = json!(stolen);
    }

    if runs("tracing") {
        // Tracing off, on with a collector that answers, and on with one that never answers:
        // the same workloads, run in the order A B C C B A so that drift over the run (the
        // disk, the machine's other load) falls on every setting alike; each figure is the
        // mean of its two runs.
        let stop = tokio_util::sync::CancellationToken::new();
        let (live, exported) = tracing::live_collector(stop.clone()).await;
        let dead = tracing::dead_collector(stop.clone()).await;
        let duration = Duration::from_secs(seconds);
        let settings = [
            ("off", None),
            ("live collector", Some(live)),
            ("dead collector", Some(dead)),
        ];
        let mut runs: Vec<Vec<tracing::Traced>> = settings.iter().map(|_| Vec::new()).collect();
        for index in [0, 1, 2, 2, 1, 0] {
            let (_, collector) = &settings[index];
            let env: Vec<(&str, String)> = collector
                .iter()
                .map(|url| ("OTEL_EXPORTER_OTLP_ENDPOINT", url.clone()))
                .collect();
            runs[index].push(tracing::measure(&server, connections, duration, samples, &env).await);
        }
        let mut figures = Vec::new();
        for ((name, _), runs) in settings.iter().zip(&runs) {
            let mean = |figure: fn(&tracing::Traced) -> f64| {
                runs.iter().map(figure).sum::<f64>() / runs.len() as f64
            };
            let submit = mean(|run| run.submit.per_second);
            let errors: u64 = runs.iter().map(|run| run.submit.errors).sum();
            let (p50, p99) = (
                mean(|run| run.latency.p50_ms),
                mean(|run| run.latency.p99_ms),
            );
            let each: Vec<String> = runs
                .iter()
                .map(|run| format!("{:.0}", run.submit.per_second))
                .collect();
            println!(
                "tracing {name}: submit {submit:.0}/s ({:.2}x pgbench; runs {}), {errors} errors; \
                 submit-to-arrival p50 {p50:.2} ms, p99 {p99:.2} ms",
                submit / pgbench_tps,
                each.join(", ")
            );
            figures.push(json!({
                "tracing": name,
                "submit_per_second": submit,
                "submit_runs_per_second": each,
                "submit_errors": errors,
                "latency_p50_ms": p50,
                "latency_p99_ms": p99,
            }));
        }
        stop.cancel();
        println!(
            "  the live collector took {:.1} MB of spans",
            exported.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
        );
        results["tracing"] = json!(figures);
    }

    if runs("hygiene") {
        let h = hygiene::half_headers(&server, 2000, Duration::from_secs(40)).await;
        println!(
            "{} connections sending half a header: {} closed by the server, the last {:.1} s after \
             the last opened; a health check meanwhile {}",
            h.connections,
            h.closed,
            h.last_closed_after.as_secs_f64(),
            if h.served_meanwhile { "answered 200" } else { "went unanswered" }
        );
        results["half_headers"] = json!({
            "connections": h.connections,
            "closed": h.closed,
            "last_closed_after_seconds": h.last_closed_after.as_secs_f64(),
            "served_meanwhile": h.served_meanwhile,
        });
    }

    if runs("neighbours") {
        let mut scenarios = Vec::new();
        for hang in [false, true] {
            let n = neighbours::slow_neighbour(&server, hang).await;
            println!(
                "{} neighbour (A: {} backlog, receiver {}; B: {} submissions 100 ms apart): \
                 B submit-to-arrival p50 {:.1} ms, max {:.1} ms; A's receiver held at most {} at once",
                if hang { "hanging" } else { "slow" },
                n.backlog,
                if hang { "hangs past the request timeout" } else { "answers after 1 s" },
                n.samples,
                n.p50_ms,
                n.max_ms,
                n.most_in_flight
            );
            scenarios.push(json!({
                "hanging": hang,
                "backlog": n.backlog,
                "b_p50_ms": n.p50_ms,
                "b_max_ms": n.max_ms,
                "a_most_in_flight": n.most_in_flight,
            }));
        }
        results["neighbours"] = json!(scenarios);
    }

    if runs("publish") {
        let publish = workloads::publish_fanout(&server, 300, 20).await;
        println!(
            "publish to {} endpoints: p50 {:.1} ms, max {:.1} ms",
            publish.endpoints, publish.p50_ms, publish.max_ms
        );
        println!(
            "publish of a {} KB payload to {} endpoints: {:.0} KB of WAL, {:.0} KB stored",
            workloads::LARGE_PAYLOAD / 1000,
            publish.endpoints,
            publish.large_wal_bytes as f64 / 1024.0,
            publish.large_stored_bytes as f64 / 1024.0
        );
        results["publish_300_p50_ms"] = json!(publish.p50_ms);
        results["publish_300_max_ms"] = json!(publish.max_ms);
        results["publish_300_large_wal_bytes"] = json!(publish.large_wal_bytes);
        results["publish_300_large_stored_bytes"] = json!(publish.large_stored_bytes);
    }

    if runs("replay") {
        let failed = env_or("BENCH_REPLAY", 100_000usize);
        let replay =
            replay::bulk_replay(&server, failed, (3 * failed).max(300_000), connections).await;
        let mut figures = Vec::new();
        for (name, measured) in [("parked", &replay.parked), ("flowing", &replay.flowing)] {
            println!(
                "replayDeliveries of {} failed deliveries ({name}: replayed {}): {:.2} s; the \
                 other endpoints' drain during it {:.0}/s, without it {:.0}/s ({:.2}x)",
                replay.failed,
                measured.replayed,
                measured.elapsed.as_secs_f64(),
                measured.others_during,
                replay.others_without,
                measured.others_during / replay.others_without
            );
            figures.push(json!({
                "replayed_deliveries": name,
                "failed": replay.failed,
                "replayed": measured.replayed,
                "seconds": measured.elapsed.as_secs_f64(),
                "others_per_second_during": measured.others_during,
                "others_per_second_without": replay.others_without,
            }));
        }
        results["replay"] = json!(figures);
    }

    if runs("retention") {
        let expired = env_or("BENCH_HISTORY", 500_000i64);
        let backlog = env_or("BENCH_RETENTION_BACKLOG", 100_000usize);
        let pruning = retention::prune_rate(&server, expired, backlog, connections).await;
        println!(
            "retention: {} expired deliveries (each with its submission and attempt) pruned \
             in {:.2} s from spawn = {:.0}/s, while a backlog of {} to one endpoint drained at \
             {:.0}/s ({:.0}/s without expired history: {:.2}x)",
            pruning.expired,
            pruning.elapsed.as_secs_f64(),
            pruning.per_second,
            pruning.backlog,
            pruning.drain_during,
            pruning.drain_without,
            pruning.drain_during / pruning.drain_without
        );
        results["retention"] = json!({
            "expired": pruning.expired,
            "seconds": pruning.elapsed.as_secs_f64(),
            "per_second": pruning.per_second,
            "backlog": pruning.backlog,
            "drain_during_per_second": pruning.drain_during,
            "drain_without_per_second": pruning.drain_without,
        });
    }

    if runs("tenants") {
        let sizes: Vec<usize> = std::env::var("BENCH_TENANT_ENDPOINTS")
            .unwrap_or_else(|_| "50,2000".to_owned())
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        let deliveries = env_or("BENCH_TENANT_DELIVERIES", 40_000usize);
        let mut measured = Vec::new();
        for endpoints in sizes {
            let pages = tenants::measure(&server, endpoints, deliveries).await;
            for (filter, ms) in &pages.medians_ms {
                println!(
                    "tenant of {} endpoints ({} deliveries, half its own): a page of {filter}: median {ms:.1} ms",
                    pages.endpoints, pages.deliveries
                );
            }
            measured.push(json!({
                "endpoints": pages.endpoints,
                "deliveries": pages.deliveries,
                "medians_ms": pages.medians_ms.iter().map(|(f, ms)| json!({ "filter": f, "ms": ms })).collect::<Vec<_>>(),
            }));
        }
        results["tenants"] = json!(measured);
    }

    if runs("history") {
        let sizes: Vec<i64> = std::env::var("BENCH_HISTORY_SIZES")
            .unwrap_or_else(|_| "100000,10000000".to_owned())
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        let mut measured = Vec::new();
        for size in sizes {
            let history = history::measure(&server, size, connections, seconds, samples).await;
            println!(
                "history of {} deliveries (seeded in {:.0} s): {:.0} bytes per delivery",
                history.deliveries, history.seed_seconds, history.bytes_per_delivery
            );
            measured.push(history);
        }
        if let Some(first) = measured.first() {
            for (n, (name, _)) in first.medians_ms.iter().enumerate() {
                let figures: Vec<String> = measured
                    .iter()
                    .map(|h| format!("{:.1} ms at {}", h.medians_ms[n].1, h.deliveries))
                    .collect();
                println!("  {name}: {}", figures.join(", "));
            }
            for h in &measured {
                println!(
                    "  on top of {} deliveries: submit {:.0}/s ({:.2}x pgbench), drain of {} to \
                     one endpoint {:.0}/s ({:.2}x), submit-to-arrival p50 {:.1} ms, p99 {:.1} ms",
                    h.deliveries,
                    h.submit_per_second,
                    h.submit_per_second / pgbench_tps,
                    history::LOAD_BACKLOG,
                    h.drain_per_second,
                    h.drain_per_second / pgbench_tps,
                    h.latency.p50_ms,
                    h.latency.p99_ms
                );
            }
        }
        results["history"] = json!(measured
            .iter()
            .map(|h| json!({
                "deliveries": h.deliveries,
                "bytes_per_delivery": h.bytes_per_delivery,
                "median_ms": h.medians_ms.iter().map(|(name, ms)| json!({ "query": name, "ms": ms })).collect::<Vec<_>>(),
                "submit_per_second": h.submit_per_second,
                "drain_per_second": h.drain_per_second,
                "latency_p50_ms": h.latency.p50_ms,
                "latency_p99_ms": h.latency.p99_ms,
            }))
            .collect::<Vec<_>>());
    }

    pgbench.close().await;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/target/courier-bench.json");
    let _ = std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/target"));
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
