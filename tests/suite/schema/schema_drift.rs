//! `schema.graphql` is generated from the code; this fails when they drift apart.

#[test]
fn checked_in_schema_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/schema.graphql");
    let checked_in = std::fs::read_to_string(path).expect("schema.graphql exists");
    let generated = courier::schema::sdl();
    assert!(
        checked_in.trim_end() == generated.trim_end(),
        "schema.graphql is out of date: run `cargo run -- schema > schema.graphql`"
    );
}
