//! A seeded mutation fuzzer for the parsers of untrusted bytes: one mutator
//! (bit flips, bytes set to 0 / 0xFF, truncation, insertion, interesting
//! integers; for JSON, huge / negative / fractional numbers, NaN and
//! Infinity, wrong types, deep nesting, missing keys), a runner that
//! catches panics, times each case and watches the largest allocation,
//! and a counting allocator. A watchdog thread fails a case that runs past
//! its time limit while it runs (an infinite loop ends the test binary
//! with the input written out, rather than hanging it).
#![allow(dead_code)]

use serde_json::Value;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// SplitMix64: small, seedable, good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers that break length and count checks.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    0x7F,
    0xFF,
    0xFFFF,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    1 << 32,
    1 << 40,
    0x7FFF_FFFF_FFFF_FFFF,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// One random change of raw bytes.
pub fn mutate_bytes(buf: &mut Vec<u8>, rng: &mut Rng) {
    let n = buf.len();
    match rng.below(9) {
        0 if n > 0 => {
            let i = rng.below(n);
            buf[i] ^= 1 << rng.below(8);
        }
        1 if n > 0 => {
            let i = rng.below(n);
            buf[i] = *rng.pick(&[0x00, 0xFF, 0x7F, 0x80]);
        }
        2 => buf.truncate(rng.below(n + 1)),
        3 => {
            let i = rng.below(n + 1);
            let k = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
            buf.splice(i..i, bytes);
        }
        4 if n > 0 => {
            let i = rng.below(n);
            let k = (1 + rng.below(64)).min(n - i);
            buf.drain(i..i + k);
        }
        5 | 6 if n >= 8 => {
            // An interesting integer over 4 or 8 bytes, aligned or not.
            let v = if rng.chance(4) {
                rng.next()
            } else {
                *rng.pick(&INTERESTING)
            };
            let w = if rng.chance(2) { 4 } else { 8 };
            let i = if rng.chance(2) {
                rng.below(n / 4) * 4
            } else {
                rng.below(n)
            };
            let i = i.min(n - w);
            buf[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
        7 if n > 0 => {
            // Duplicate a chunk somewhere else.
            let i = rng.below(n);
            let k = (1 + rng.below(64)).min(n - i);
            let chunk = buf[i..i + k].to_vec();
            let at = rng.below(n + 1);
            buf.splice(at..at, chunk);
        }
        _ if n > 0 => {
            let i = rng.below(n);
            buf[i] = rng.next() as u8;
        }
        _ => buf.push(rng.next() as u8),
    }
}

/// A value that is the wrong kind of thing, or a number no field allows.
fn odd_value(rng: &mut Rng) -> Value {
    use serde_json::json;
    match rng.below(18) {
        0 => json!(u64::MAX),
        1 => json!(i64::MIN),
        2 => json!(-1),
        3 => json!(0),
        4 => json!(1e308),
        5 => json!(-1e308),
        6 => json!(0.5),
        7 => json!(1e-300),
        8 => json!(1u64 << rng.below(64)),
        9 => json!("x"),
        10 => json!(true),
        11 => Value::Null,
        12 => json!([]),
        13 => json!({}),
        14 => deep(1 + rng.below(300), rng.chance(2)),
        15 => json!("a".repeat(rng.below(4096))),
        16 => json!([-1, 1e308, "x", null]),
        _ => json!(-(rng.below(1000) as i64)),
    }
}

/// `depth` nested lists or objects.
fn deep(depth: usize, objects: bool) -> Value {
    let mut v = Value::Null;
    for _ in 0..depth {
        v = if objects {
            serde_json::json!({ "k": v })
        } else {
            Value::Array(vec![v])
        };
    }
    v
}

/// Every node of `v`, as a path of object keys / list indices.
fn paths(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                at.push(PathStep::Key(k.clone()));
                paths(c, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                at.push(PathStep::Index(i));
                paths(c, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn node<'a>(v: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        PathStep::Key(k) => &mut v[k.as_str()],
        PathStep::Index(i) => &mut v[*i],
    })
}

/// One structural change of a JSON document: a node replaced with an odd
/// value, removed, duplicated, or a container emptied.
pub fn mutate_value(v: &mut Value, rng: &mut Rng) {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    let path = rng.pick(&all).clone();
    match rng.below(6) {
        0 if !path.is_empty() => {
            let (last, parent) = path.split_last().unwrap_or_else(|| unreachable!());
            match (node(v, parent), last) {
                (Value::Object(m), PathStep::Key(k)) => {
                    m.remove(k);
                }
                (Value::Array(a), PathStep::Index(i)) => {
                    a.remove(*i);
                }
                _ => {}
            }
        }
        1 => match node(v, &path) {
            Value::Array(a) if !a.is_empty() => {
                let x = a[rng.below(a.len())].clone();
                let k = 1 + rng.below(8);
                a.extend(std::iter::repeat_n(x, k));
            }
            Value::Object(m) => m.clear(),
            other => *other = odd_value(rng),
        },
        2 => {
            let n = node(v, &path);
            if let Some(x) = n.as_f64() {
                *n = serde_json::json!(-x);
            } else {
                *n = odd_value(rng);
            }
        }
        _ => *node(v, &path) = odd_value(rng),
    }
}

/// JSON text with NaN / Infinity / other tokens JSON does not have in
/// place of a number, or a byte-level change.
pub fn mutate_json_text(text: &mut Vec<u8>, rng: &mut Rng) {
    let digits: Vec<usize> = text
        .iter()
        .enumerate()
        .filter(|(_, c)| c.is_ascii_digit())
        .map(|(i, _)| i)
        .collect();
    if !digits.is_empty() && rng.chance(2) {
        let i = *rng.pick(&digits);
        let toks: [&[u8]; 7] = [
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"1e999",
            b"-0",
            b"0x10",
            b"99999999999999999999999",
        ];
        let tok = *rng.pick(&toks);
        text.splice(i..i + 1, tok.iter().copied());
    } else {
        mutate_bytes(text, rng);
    }
}

/// Mutate a JSON document (bytes): mostly structurally, sometimes as text.
pub fn mutate_json(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let rounds = 1 + rng.below(3);
    match serde_json::from_slice::<Value>(bytes) {
        Ok(mut v) if !rng.chance(4) => {
            for _ in 0..rounds {
                mutate_value(&mut v, rng);
            }
            serde_json::to_vec(&v).unwrap_or_default()
        }
        _ => {
            let mut t = bytes.to_vec();
            for _ in 0..rounds {
                mutate_json_text(&mut t, rng);
            }
            t
        }
    }
}

/// Several raw byte changes.
pub fn mutate_raw(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(4) {
        mutate_bytes(&mut b, rng);
    }
    b
}

thread_local! {
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting on each thread the largest single
/// allocation since the last [`take_peak`].
pub struct CountingAlloc;

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        unsafe { System.realloc(p, l, new) }
    }
}

fn note(size: usize) {
    let _ = PEAK.try_with(|p| {
        if size > p.get() {
            p.set(size)
        }
    });
}

/// The largest allocation on this thread since the last call.
pub fn take_peak() -> usize {
    PEAK.try_with(|p| p.replace(0)).unwrap_or(0)
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    pub cases: u64,
    /// Cases the parser accepted (the rest were refused with an error).
    pub accepted: u64,
    pub slowest: Duration,
    pub largest_alloc: usize,
    pub elapsed: Duration,
}

/// How one parser is fuzzed.
pub struct Target<'a> {
    pub name: &'a str,
    /// Valid inputs the mutations start from.
    pub seeds: Vec<Vec<u8>>,
    /// Makes one mutated input from a seed.
    pub mutate: &'a dyn Fn(&[u8], &mut Rng) -> Vec<u8>,
    /// The largest single allocation a case may make.
    pub alloc_limit: usize,
    /// The longest a case may take.
    pub time_limit: Duration,
}

/// Where a failing input is written: `target/tmp/fuzz-failures/`.
fn failure_file(name: &str, seed: u64, case: u64, input: &[u8]) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let file = dir.join(format!("{safe}-{seed}-{case}.bin"));
    let _ = std::fs::write(&file, input);
    file
}

/// The case running now, as the watchdog sees it.
struct Running {
    case: u64,
    which: usize,
    started: Instant,
    input: Arc<Vec<u8>>,
}

/// A thread that ends the process (exit status 101, as a failed test)
/// when a case runs past `limit`, after writing its input out. A case
/// that never returns cannot be failed from inside its own thread; this
/// is the only way to fail it rather than hang.
struct Watchdog {
    current: Arc<Mutex<Option<Running>>>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(name: &str, seed: u64, limit: Duration) -> Watchdog {
        let current: Arc<Mutex<Option<Running>>> = Arc::new(Mutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let tick = (limit / 20).clamp(Duration::from_millis(5), Duration::from_millis(50));
        let (c, d, name) = (current.clone(), done.clone(), name.to_string());
        let thread = std::thread::spawn(move || {
            while !d.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                let guard = c.lock().unwrap_or_else(|e| e.into_inner());
                let Some(r) = guard.as_ref() else { continue };
                let took = r.started.elapsed();
                if took > limit {
                    let file = failure_file(&name, seed, r.case, &r.input);
                    eprintln!(
                        "{name}: case {} (seed {seed}, from seed input {}): still running after {took:?} (limit {limit:?}); input in {}",
                        r.case,
                        r.which,
                        file.display()
                    );
                    std::process::exit(101);
                }
            }
        });
        Watchdog {
            current,
            done,
            thread: Some(thread),
        }
    }

    fn watch(&self, r: Option<Running>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = r;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run `cases` mutated inputs through `parse(seed index, bytes)`, which
/// returns whether the input was accepted and panics (or asserts) on
/// anything that must not happen. A panic or a case over the allocation
/// limit fails the run, with the input written out to replay; a case over
/// the time limit is failed by the watchdog while it runs.
pub fn run(t: &Target<'_>, cases: u64, seed: u64, parse: &mut dyn FnMut(usize, &[u8]) -> bool) -> Report {
    let mut r = Report::default();
    let start = Instant::now();
    let dog = Watchdog::start(t.name, seed, t.time_limit);
    for case in 0..cases {
        let mut rng = Rng::new(seed ^ case.wrapping_mul(0xA24B_AED4_963E_E407));
        let which = rng.below(t.seeds.len());
        let input = Arc::new((t.mutate)(&t.seeds[which], &mut rng));
        dog.watch(Some(Running {
            case,
            which,
            started: Instant::now(),
            input: input.clone(),
        }));
        take_peak();
        let t0 = Instant::now();
        let out = catch_unwind(AssertUnwindSafe(|| parse(which, &input)));
        let took = t0.elapsed();
        let peak = take_peak();
        dog.watch(None);
        let fail = |what: String| -> ! {
            let file = failure_file(t.name, seed, case, &input);
            panic!(
                "{}: case {case} (seed {seed}, from seed input {which}): {what}; input in {}",
                t.name,
                file.display()
            )
        };
        match out {
            Ok(accepted) => r.accepted += accepted as u64,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                fail(format!("panicked: {msg}"))
            }
        }
        if peak > t.alloc_limit {
            fail(format!("allocated {peak} bytes at once (limit {})", t.alloc_limit));
        }
        r.slowest = r.slowest.max(took);
        r.largest_alloc = r.largest_alloc.max(peak);
        r.cases += 1;
    }
    drop(dog);
    r.elapsed = start.elapsed();
    println!(
        "fuzz {}: {} cases ({} accepted) in {:.1} s, slowest case {:.2} ms, largest allocation {} bytes",
        t.name,
        r.cases,
        r.accepted,
        r.elapsed.as_secs_f64(),
        r.slowest.as_secs_f64() * 1e3,
        r.largest_alloc
    );
    r
}
