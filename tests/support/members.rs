//! A test's fleet of OS processes: the test binary run again as children, each running one
//! ignored test (the member's work) with its own environment, and their outputs read once
//! all of them ended.

use std::process::{Child, Command, Stdio};

/// Starts `count` children of this test binary, each running the ignored test `member`
/// alone with the variables `environment` gives for its index.
pub fn start(
    member: &str,
    count: usize,
    environment: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<Child> {
    let program = std::env::current_exe().expect("the test binary's path");
    (0..count)
        .map(|index| {
            Command::new(&program)
                .args([member, "--exact", "--ignored", "--nocapture"])
                .envs(environment(index))
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("starting a fleet member")
        })
        .collect()
}

/// What each child printed, in the order they were started, once every one of them ended;
/// each must have succeeded.
pub async fn outputs(members: Vec<Child>) -> Vec<String> {
    let outputs = tokio::task::spawn_blocking(move || {
        members
            .into_iter()
            .map(|member| member.wait_with_output().expect("a member's output"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("waiting for the members");
    outputs
        .iter()
        .enumerate()
        .map(|(index, output)| {
            assert!(
                output.status.success(),
                "member {index} failed: {:?}",
                output.status
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        })
        .collect()
}
