//! The first fifteen minutes, through the built binary: fatal errors told once on one line
//! naming what to change, nonsensical settings refused, and no secret ever told.

use crate::support::postgres_server;
use crate::support::process::{fatal_line, plain_courier, run_to_end, TempDir};

#[test]
fn a_taken_port_names_the_address_and_courier_bind() {
    let db = TempDir::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let mut command = plain_courier(&format!(
        "sqlite://{}?mode=rwc",
        db.0.join("c.db").display()
    ));
    command.arg("serve").env("COURIER_BIND", &addr);
    let line = fatal_line(&run_to_end(command));
    assert!(line.contains(&addr), "{line}");
    assert!(line.contains("COURIER_BIND"), "{line}");
    assert!(line.contains("already in use"), "{line}");
}

#[test]
fn an_unreachable_postgres_is_told_by_its_real_cause_and_host() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let mut command = plain_courier(&format!("postgres://postgres@127.0.0.1:{port}/courier"));
    command
        .arg("migrate")
        .env("COURIER_DB_ACQUIRE_TIMEOUT_MS", "300");
    let line = fatal_line(&run_to_end(command));
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.to_lowercase().contains("connection refused"), "{line}");
    assert!(!line.contains("pool timed out"), "{line}");
    assert!(line.contains("DATABASE_URL"), "{line}");

    // A socket directory is told as the socket, not as a host.
    let dir = TempDir::new();
    let url = format!(
        "postgres://postgres@localhost/courier?host={}",
        dir.0.display()
    );
    let mut command = plain_courier(&url);
    command
        .arg("migrate")
        .env("COURIER_DB_ACQUIRE_TIMEOUT_MS", "300");
    let line = fatal_line(&run_to_end(command));
    let socket = dir.0.join(".s.PGSQL.5432");
    assert!(
        line.contains(&format!("the socket {}", socket.display())),
        "{line}"
    );
}

#[test]
fn a_postgres_that_never_answers_is_told_with_both_waits() {
    // Connections are accepted (the backlog holds them) and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let mut command = plain_courier(&format!("postgres://postgres@127.0.0.1:{port}/courier"));
    command
        .arg("migrate")
        .env("COURIER_DB_ACQUIRE_TIMEOUT_MS", "300");
    let line = fatal_line(&run_to_end(command));
    drop(silent);
    assert!(line.contains("no answer in 300 ms"), "{line}");
    assert!(line.contains("second look as long"), "{line}");
    assert!(line.contains("DATABASE_URL"), "{line}");
}

#[tokio::test]
async fn a_postgres_refusal_is_told_without_its_server_source_line() {
    let server = postgres_server::url().await;
    let mut url = url::Url::parse(&server).expect("server URL");
    url.set_path("courier_no_such_database");
    let mut command = plain_courier(url.as_str());
    command.arg("migrate");
    let output = tokio::task::spawn_blocking(move || run_to_end(command))
        .await
        .expect("run");
    let line = fatal_line(&output);
    assert!(
        line.contains("\"courier_no_such_database\" does not exist"),
        "{line}"
    );
    assert!(line.contains("DATABASE_URL"), "{line}");
}

#[test]
fn an_sqlite_file_that_cannot_be_opened_suggests_mode_rwc() {
    let dir = TempDir::new();
    let path = dir.0.join("missing.db");
    let mut command = plain_courier(&format!("sqlite://{}", path.display()));
    command.arg("migrate");
    let line = fatal_line(&run_to_end(command));
    assert!(line.contains("?mode=rwc"), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");

    // A missing directory is named, with or without ?mode=rwc (which cannot help there).
    let nowhere = dir.0.join("no-such-directory").join("c.db");
    for query in ["?mode=rwc", ""] {
        let mut command = plain_courier(&format!("sqlite://{}{query}", nowhere.display()));
        command.arg("migrate");
        let line = fatal_line(&run_to_end(command));
        let directory = nowhere.parent().expect("parent").display().to_string();
        assert!(
            line.contains(&format!("the directory {directory} does not exist")),
            "{line}"
        );
        assert!(!line.contains("add ?mode=rwc"), "{line}");
    }
}

#[test]
fn nonsensical_settings_are_refused_by_name() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}?mode=rwc", dir.0.join("c.db").display());

    let mut command = plain_courier(&url);
    command.env("COURIER_RATE_LIMIT", "0");
    let line = fatal_line(&run_to_end(command));
    assert!(line.contains("COURIER_RATE_LIMIT"), "{line}");
    assert!(line.contains("at least 1"), "{line}");

    let mut command = plain_courier(&url);
    command
        .arg("serve")
        .env("COURIER_RETRY_BASE_MS", "5000")
        .env("COURIER_RETRY_MAX_MS", "1000");
    let line = fatal_line(&run_to_end(command));
    assert!(
        line.contains("COURIER_RETRY_BASE_MS") && line.contains("COURIER_RETRY_MAX_MS"),
        "{line}"
    );

    let mut command = plain_courier(&url);
    command
        .arg("serve")
        .env("COURIER_ALLOW_PRIVATE_DESTINATIONS", "maybe");
    let line = fatal_line(&run_to_end(command));
    assert!(
        line.contains("COURIER_ALLOW_PRIVATE_DESTINATIONS"),
        "{line}"
    );
}

/// What cannot be read at all is a usage error, exit code 2: a `DATABASE_URL` with an
/// unknown scheme or a broken port (told without repeating the URL and its password), a
/// command group without its subcommand, a subcommand without a required flag (told as one
/// sentence), settings that contradict each other.
#[test]
fn unreadable_urls_and_incomplete_commands_exit_2() {
    for (url, told) in [
        (
            "mysql://root:hunter2@db/courier",
            "must start with postgres://",
        ),
        ("postgres://root:hunter2@db:port/courier", "cannot be read"),
    ] {
        let output = run_to_end(plain_courier(url));
        assert_eq!(output.status.code(), Some(2), "{url}");
        let line = fatal_line(&output);
        assert!(line.contains(told), "{line}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("hunter2"),
            "the password is never told, in no line: {stderr}"
        );
    }
    // Nor is an encryption key, even one of a list that is half wrong.
    let dir = TempDir::new();
    let url = format!("sqlite://{}?mode=rwc", dir.0.join("k.db").display());
    let mut command = plain_courier(&url);
    command.env(
        "COURIER_ENCRYPTION_KEY",
        "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=,garbage",
    );
    let output = run_to_end(command);
    assert_eq!(output.status.code(), Some(2));
    let line = fatal_line(&output);
    assert!(line.contains("COURIER_ENCRYPTION_KEY"), "{line}");
    assert!(line.contains("key 2 is not base64"), "{line}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("c2VjcmV0"),
        "the key is never told: {stderr}"
    );
    let url = format!("sqlite://{}?mode=rwc", dir.0.join("c.db").display());
    for group in ["tenant", "api-key"] {
        let mut command = plain_courier(&url);
        command.arg(group);
        let output = run_to_end(command);
        assert_eq!(output.status.code(), Some(2), "courier {group}");
        let help = String::from_utf8_lossy(&output.stderr);
        assert!(
            help.contains("create"),
            "the help names the subcommands: {help}"
        );
    }
    let mut command = plain_courier(&url);
    command.args(["tenant", "create"]);
    let output = run_to_end(command);
    assert_eq!(output.status.code(), Some(2));
    let line = fatal_line(&output);
    assert!(line.contains("not provided: --name"), "{line}");
    // Flags that contradict each other are a usage error too, told before the database is
    // opened (none is made).
    let mut command = plain_courier(&url);
    let tenant = uuid::Uuid::new_v4().to_string();
    command.args([
        "api-key", "create", "--name", "x", "--role", "admin", "--tenant", &tenant,
    ]);
    let output = run_to_end(command);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let line = fatal_line(&output);
    assert!(line.contains("an admin key is not limited"), "{line}");
    assert!(!dir.0.join("c.db").exists(), "the database was opened");

    // A negative number where none may be says so; a flag the command does not take is
    // named as typed, not as a variable.
    let mut command = plain_courier(&url);
    command.arg("migrate").env("COURIER_DB_TIMEOUT_MS", "-1");
    let output = run_to_end(command);
    assert_eq!(output.status.code(), Some(2));
    let line = fatal_line(&output);
    assert!(line.contains("COURIER_DB_TIMEOUT_MS"), "{line}");
    assert!(line.contains("it must not be negative"), "{line}");
    let mut command = plain_courier(&url);
    command.args(["migrate", "--bind", "127.0.0.1:1"]);
    let output = run_to_end(command);
    assert_eq!(output.status.code(), Some(2));
    let line = fatal_line(&output);
    assert!(line.contains("unexpected argument '--bind'"), "{line}");
    assert!(!line.contains("COURIER_BIND"), "{line}");

    // Settings each readable but contradicting each other are a usage error too.
    let mut command = plain_courier(&url);
    command
        .env("COURIER_RETRY_BASE_MS", "5000")
        .env("COURIER_RETRY_MAX_MS", "1000");
    let output = run_to_end(command);
    assert_eq!(output.status.code(), Some(2));
    let line = fatal_line(&output);
    assert!(line.contains("COURIER_RETRY_BASE_MS (5000)"), "{line}");
}

/// A second `courier serve` on a SQLite file another serves is refused at once, naming the
/// file and the rule (one process per SQLite file); once the first has stopped, the file
/// serves again. `courier api-key` beside a running server still works.
#[test]
fn a_second_server_on_one_sqlite_file_is_refused() {
    use crate::support::process::Served;

    let dir = TempDir::new();
    let url = format!("sqlite://{}?mode=rwc", dir.0.join("shared.db").display());
    let first = Served::start(&url, &[]);
    let mut second = plain_courier(&url);
    second.arg("serve").env("COURIER_BIND", "127.0.0.1:0");
    let output = run_to_end(second);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let line = fatal_line(&output);
    assert!(line.contains("shared.db"), "{line}");
    assert!(line.contains("one process per SQLite file"), "{line}");

    let mut key = plain_courier(&url);
    key.args(["api-key", "create", "--name", "beside", "--role", "admin"]);
    let created = run_to_end(key);
    assert!(created.status.success(), "{created:?}");

    drop(first);
    let again = Served::start(&url, &[]);
    drop(again);
}

/// A SQLite database that opens but cannot be written (here `?mode=ro`; a file this user
/// may only read is the same) is refused at start, saying why, rather than served looking
/// ready while every submission fails; a SQLite name given as a `file:` URI (which SQLite
/// would read as another file than the one locked) is refused as a setting.
#[test]
fn a_sqlite_database_that_cannot_be_written_is_not_served() {
    let dir = TempDir::new();
    let path = dir.0.join("readonly.db");
    let mut migrate = plain_courier(&format!("sqlite://{}?mode=rwc", path.display()));
    migrate.arg("migrate");
    assert!(run_to_end(migrate).status.success());

    let mut serve = plain_courier(&format!("sqlite://{}?mode=ro", path.display()));
    serve.arg("serve").env("COURIER_BIND", "127.0.0.1:0");
    let output = run_to_end(serve);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let line = fatal_line(&output);
    assert!(line.contains("cannot write the database"), "{line}");
    assert!(line.contains("readonly.db"), "{line}");

    let mut serve = plain_courier(&format!("sqlite://file:{}?mode=rwc", path.display()));
    serve.arg("serve").env("COURIER_BIND", "127.0.0.1:0");
    let output = run_to_end(serve);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(fatal_line(&output).contains("file: URI"), "{output:?}");
}

/// Two commands started together on a new SQLite file both run: the connection that found
/// the file locked by the other's set-up (its switch to WAL) was refused at once with
/// "database is locked", 1 run in 8, where statements wait out the busy timeout.
#[test]
fn two_commands_started_together_on_a_new_sqlite_file_both_run() {
    let dir = TempDir::new();
    for round in 0..30 {
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.0.join(format!("{round}.db")).display()
        );
        let spawn = || {
            let mut command = plain_courier(&url);
            command
                .arg("migrate")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            command.spawn().expect("spawn courier migrate")
        };
        let (first, second) = (spawn(), spawn());
        for child in [first, second] {
            let output = child.wait_with_output().expect("output");
            assert!(
                output.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
