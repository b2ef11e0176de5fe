//! Listening sockets: attributed only when an owned process holds the socket.

use std::time::Duration;

use super::common::*;

fn python() -> Option<String> {
    let ok = std::process::Command::new("python3")
        .arg("-c")
        .arg("import socket")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Some("python3".into())
    } else {
        skip("python3 is needed to open a listener from the child");
        None
    }
}

#[test]
fn child_listener_is_an_opened_attributed_port() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = "import socket,time\n\
s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n\
open('port','w').write(str(s.getsockname()[1]))\n\
time.sleep(0.6)\n";
    let mut s = spec(dir.path(), &[&py, "-c", script]);
    s.observe_ports = true;
    let ev = run(s);
    assert_eq!(
        ev.exit.code,
        Some(0),
        "{}",
        read(&dir.path().join("stderr.txt"))
    );
    let port: u16 = read(&dir.path().join("port")).parse().unwrap();
    let rec = ev
        .ports
        .opened
        .iter()
        .find(|r| r.port == port)
        .unwrap_or_else(|| panic!("port {port} not seen: {:#?}", ev.ports));
    assert_eq!(rec.protocol, "tcp");
    assert_eq!(rec.address, "127.0.0.1");
    assert!(rec.attributed);
    assert_eq!(rec.owner.as_ref(), Some(&ev.processes[0].identity));
    assert_eq!(ev.ports.mode, agentdiff_backend_api::PortMode::Observe);
    assert!(ev.ports.note.contains("does not block"));
}

#[test]
fn listener_of_another_process_is_machine_wide_only() {
    let dir = tempfile::tempdir().unwrap();
    // Files order the two sides however slow the machine: the listener opens after the run's
    // baseline (the command has started) and the command ends after it is open; the listener
    // stays open until the run is over.
    let (started, bound) = (dir.path().join("started"), dir.path().join("bound"));
    let mut s = spec(
        dir.path(),
        &[
            "sh",
            "-c",
            "touch started; i=0; until [ -e bound ] || [ $i -ge 1000 ]; do sleep 0.01; \
             i=$((i+1)); done; sleep 0.2",
        ],
    );
    s.observe_ports = true;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let opener = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !started.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let l = std::net::TcpListener::bind("[::1]:0")
            .or_else(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = l.local_addr().unwrap().port();
        std::fs::write(&bound, "").unwrap();
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
        drop(l);
        port
    });
    let ev = run(s);
    done_tx.send(()).unwrap();
    let port = opener.join().unwrap();
    let rec = ev
        .ports
        .opened
        .iter()
        .find(|r| r.port == port)
        .unwrap_or_else(|| panic!("port {port} not seen: {:#?}", ev.ports));
    assert!(!rec.attributed);
    assert!(rec.owner.is_none());
}

#[test]
fn ports_off_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let ev = run(spec(dir.path(), &["true"]));
    assert_eq!(ev.ports.mode, agentdiff_backend_api::PortMode::Off);
    assert!(ev.ports.opened.is_empty());
}
