//! The flags' parsing and checks: schedules, doubling, pool sizes.

use super::*;
use crate::worker::schedule::Delays;

/// One group of flags (`A`) parsed from `flags` alone.
fn parse_group<A: Args + clap::FromArgMatches>(flags: &[&str]) -> Result<A, clap::Error> {
    let argv = std::iter::once("courier").chain(flags.iter().copied());
    let matches = A::augment_args(clap::Command::new("courier")).try_get_matches_from(argv)?;
    A::from_arg_matches(&matches)
}

fn parse(flags: &[&str]) -> Result<ServeArgs, clap::Error> {
    parse_group(flags)
}

#[test]
fn the_schedule_overrides_doubling_and_doubling_works_alone() {
    let listed = parse(&["--retry-schedule", "5s,5m", "--max-attempts", "3"]).unwrap();
    let policy = listed.retry_policy();
    assert_eq!(policy.attempts_per_cycle(), 3, "two delays, three attempts");
    assert_eq!(
        policy.nominal_delays(),
        [Duration::from_secs(5), Duration::from_secs(300)]
    );

    let attempts_only = parse(&["--max-attempts", "4"]).unwrap().retry_policy();
    assert_eq!(
        attempts_only.delays,
        Delays::Doubling {
            base: DEFAULT_DOUBLING_BASE,
            attempts: 4
        }
    );
    let base_only = parse(&["--retry-base-ms", "250"]).unwrap().retry_policy();
    assert_eq!(
        base_only.delays,
        Delays::Doubling {
            base: Duration::from_millis(250),
            attempts: DEFAULT_DOUBLING_ATTEMPTS
        }
    );

    let default = parse(&[]).unwrap().retry_policy();
    assert_eq!(default.nominal_delays(), DEFAULT_DELAYS);
    assert!(default.span() >= Duration::from_secs(24 * 3_600));
}

#[test]
fn a_bad_schedule_is_refused_with_its_reason() {
    let err = parse(&["--retry-schedule", "5s,soon"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"soon\" does not start with a whole number"),
        "{err}"
    );
    let err = parse(&["--retry-schedule", "40d"]).unwrap_err().to_string();
    assert!(err.contains("longer than the longest"), "{err}");
}

#[test]
fn a_pool_size_out_of_range_is_refused_not_allocated() {
    #[derive(Parser)]
    struct Only {
        #[command(flatten)]
        database: DatabaseArgs,
    }
    let pool =
        |size: &str| Only::try_parse_from(["courier", "--db-pool-size", size]).map(|o| o.database);
    assert_eq!(pool("1000").map(|d| d.db_pool_size).ok(), Some(1000));
    assert_eq!(pool("2").map(|d| d.db_pool_size).ok(), Some(2));
    for refused in ["0", "1", "1001", "4294967295", "-1", "many"] {
        assert!(pool(refused).is_err(), "{refused}");
    }
}

#[test]
fn the_base_above_the_cap_is_refused_only_when_doubling() {
    let doubling = parse(&["--retry-base-ms", "7200000"]).unwrap();
    assert!(doubling
        .check()
        .unwrap_err()
        .contains("COURIER_RETRY_BASE_MS"));
    let listed = parse(&["--retry-base-ms", "7200000", "--retry-schedule", "1m"]).unwrap();
    assert_eq!(listed.check(), Ok(()));
}

#[test]
fn a_lease_no_longer_than_a_request_is_doubted() {
    assert_eq!(parse(&[]).unwrap().doubts(), Vec::<String>::new());
    for (lease, timeout) in [("10", "10000"), ("5", "30000")] {
        let doubts = parse(&["--lease-secs", lease, "--request-timeout-ms", timeout])
            .unwrap()
            .doubts();
        assert_eq!(doubts.len(), 1, "{lease} s, {timeout} ms");
        assert!(doubts[0].contains("COURIER_LEASE_SECS"), "{doubts:?}");
    }
    let above = parse(&["--lease-secs", "11", "--request-timeout-ms", "10000"]).unwrap();
    assert_eq!(above.doubts(), Vec::<String>::new());
}

#[test]
fn the_default_public_url_is_one_a_browser_can_open() {
    let settled = |bind: &str, listening: &str| {
        let mut config = parse(&["--bind", bind]).unwrap();
        let warned = config.settle_public_url(listening.parse().unwrap());
        (config.public_url(), warned.is_some())
    };
    let local = settled("127.0.0.1:8080", "127.0.0.1:8080");
    assert_eq!(local, ("http://127.0.0.1:8080".to_owned(), false));
    let any_port = settled("127.0.0.1:0", "127.0.0.1:41234");
    assert_eq!(any_port, ("http://127.0.0.1:41234".to_owned(), false));
    let everywhere = settled("0.0.0.0:8080", "0.0.0.0:8080");
    assert_eq!(everywhere, ("http://127.0.0.1:8080".to_owned(), true));
    let everywhere_v6 = settled("[::]:8080", "[::]:8080");
    assert_eq!(everywhere_v6, ("http://[::1]:8080".to_owned(), true));

    let mut set = parse(&["--bind", "0.0.0.0:0", "--public-url", "https://c.example/x"]).unwrap();
    assert_eq!(set.settle_public_url("0.0.0.0:5000".parse().unwrap()), None);
    assert_eq!(set.public_url(), "https://c.example/x");
}

#[test]
fn the_rate_limit_is_a_positive_whole_number_like_every_other() {
    assert_eq!(parse(&["--rate-limit", "5"]).unwrap().rate_limit, Some(5));
    for refused in ["0", " 5", "5 ", "-1", "4294967296", "five"] {
        assert!(parse(&["--rate-limit", refused]).is_err(), "{refused:?}");
    }
}

#[test]
fn body_and_payload_sizes_of_zero_or_beyond_a_gibibyte_are_refused() {
    let sizes = parse(&["--max-body-bytes", "4096", "--max-payload-bytes", "2"]).unwrap();
    assert_eq!((sizes.max_body_bytes, sizes.max_payload_bytes), (4096, 2));
    for flag in ["--max-body-bytes", "--max-payload-bytes"] {
        for refused in ["0", "1", "1073741825", "-1", "big"] {
            assert!(parse(&[flag, refused]).is_err(), "{flag} {refused}");
        }
    }
}

#[test]
fn the_bind_address_may_name_a_host() {
    let bind = |value: &str| parse(&["--bind", value]).map(|args| args.bind);
    assert_eq!(
        bind("127.0.0.1:9000").ok(),
        Some("127.0.0.1:9000".parse().unwrap())
    );
    assert_eq!(bind("[::1]:9000").ok(), Some("[::1]:9000".parse().unwrap()));
    let named = bind("localhost:9000").expect("localhost resolves");
    assert!(named.ip().is_loopback() && named.port() == 9000, "{named}");
    for refused in ["localhost", "127.0.0.1:port", ":::"] {
        assert!(bind(refused).is_err(), "{refused}");
    }
}

fn parse_tracing(flags: &[&str]) -> Result<TracingArgs, clap::Error> {
    parse_group(flags)
}

/// An OpenTelemetry setting that is set but empty counts as unset, as OpenTelemetry's SDKs
/// read them: no tracing for an empty endpoint, the default name for an empty one.
#[test]
fn empty_tracing_settings_count_as_unset() {
    let empty = parse_tracing(&["--otlp-endpoint", "", "--otlp-traces-endpoint", " "]).unwrap();
    assert_eq!(empty.traces_url(), None);
    let base = parse_tracing(&[
        "--otlp-endpoint",
        "http://collector:4318/",
        "--otlp-traces-endpoint",
        "",
    ])
    .unwrap();
    assert_eq!(
        base.traces_url().as_deref(),
        Some("http://collector:4318/v1/traces")
    );
    assert!(parse_tracing(&["--otlp-endpoint", "collector"]).is_err());

    let unnamed = parse_tracing(&["--otel-service-name", ""]).unwrap();
    assert_eq!(unnamed.service_name(None), "courier");
    assert_eq!(unnamed.service_name(Some(String::new())), "courier");
    assert_eq!(
        unnamed.service_name(Some("from-attributes".into())),
        "from-attributes"
    );
    let named = parse_tracing(&["--otel-service-name", "billing-hooks"]).unwrap();
    assert_eq!(
        named.service_name(Some("from-attributes".into())),
        "billing-hooks"
    );
}

#[test]
fn a_public_url_with_credentials_is_refused() {
    assert!(parse_public_url("https://courier.example.com/ops/").is_ok());
    for refused in [
        "https://user:pw@courier.example.com/",
        "https://user@courier.example.com/",
        "https://courier.example.com/?a=b",
        "ftp://courier.example.com/",
        "http://courier.example.com:0/",
    ] {
        assert!(parse_public_url(refused).is_err(), "{refused}");
    }
}

/// The span batching settings are held to ranges a queue can be allocated for: the SDK
/// itself allocates whatever it is given (a queue of `u64::MAX` spans aborted start-up)
/// and takes anything unreadable for its default.
#[test]
fn span_batching_settings_are_held_to_their_ranges() {
    let given = parse_tracing(&[
        "--otel-bsp-max-queue-size",
        "4096",
        "--otel-bsp-max-export-batch-size",
        "",
        "--otel-bsp-schedule-delay",
        "250",
    ])
    .unwrap();
    assert_eq!(
        given.otel_bsp_max_queue_size,
        Some(BatchSetting(Some(4096)))
    );
    assert_eq!(
        given.otel_bsp_max_export_batch_size,
        Some(BatchSetting(None))
    );
    let config = format!("{:?}", given.batch_config());
    assert!(config.contains("max_queue_size: 4096"), "{config}");
    assert!(config.contains("scheduled_delay: 250ms"), "{config}");
    for refused in ["0", "1000001", "18446744073709551615", "-1", "many", " 5"] {
        assert!(
            parse_tracing(&["--otel-bsp-max-queue-size", refused]).is_err(),
            "{refused}"
        );
    }
    assert!(parse_tracing(&["--otel-bsp-schedule-delay", "86400001"]).is_err());
}
