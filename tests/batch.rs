//! Several sequences in one forward pass (`Model::eval_batch`, SPEC.md
//! §3): a sequence evaluated in a batch — mixing prefill chunks and
//! one-token steps, sequences of different lengths — gives the logits it
//! gives alone (within rounding: the products over several rows run other
//! kernels than one row's) and the same greedy tokens, for every golden
//! fixture, on the CPU and on CUDA (counted as ignored where no GPU is).

mod common;

use common::*;
use moeflux::generate::{Batch, BatchEvent, Finish, Generation, Generator, Request};
use moeflux::text::{SamplingParams, TextStream};
use moeflux::{BatchItem, Device, Error, Model, Options, Session};
use std::collections::HashMap;

/// Batched against alone, on the CPU: the same f32 arithmetic in another
/// order (matrix-matrix against matrix-vector products).
const CPU_TOL: f64 = 1e-5;
/// On CUDA, as `cuda_golden`'s token-by-token tolerance.
const CUDA_TOL: f64 = 1e-4;

/// Token ids of three sequences (below every fixture's vocabulary).
const SEQ: [[u32; 12]; 3] = [
    [3, 101, 57, 402, 260, 19, 333, 0, 488, 150, 77, 5],
    [9, 9, 250, 31, 140, 499, 2, 64, 301, 17, 460, 88],
    [120, 44, 7, 380, 211, 56, 99, 430, 12, 305, 66, 1],
];

/// The steps of the schedule: per step, for each sequence, how many of its
/// next tokens are evaluated (0: the sequence sits the step out) and
/// whether all their logits are wanted.
const SCHEDULE: [[(usize, bool); 3]; 5] = [
    [(5, false), (2, true), (0, false)],
    [(1, false), (3, false), (4, false)],
    [(1, false), (1, false), (1, false)],
    [(0, false), (1, false), (3, true)],
    [(1, true), (2, false), (1, false)],
];

/// The fixture opened with the exact products, or with the fast path
/// (`exact` false: on CUDA, batched decode steps through quantized
/// matrices take the tensor cores, a token alone does not).
fn open_with(dir: &std::path::Path, device: Device, exact: bool) -> Model {
    let opts = Options {
        device,
        exact,
        ..Options::default()
    };
    Model::open(dir, &opts).expect("open the packed fixture")
}

/// Each sequence's logits per step of `SCHEDULE`, evaluated alone
/// (`batched` false) or all together in one `eval_batch` per step.
fn run(model: &Model, batched: bool) -> Vec<Vec<Vec<f32>>> {
    let mut sessions: Vec<Session> = (0..3).map(|_| model.session().unwrap()).collect();
    let mut at = [0usize; 3];
    let mut out = vec![Vec::new(); 3];
    for step in SCHEDULE {
        let mut items = Vec::new();
        let mut who = Vec::new();
        for (i, (s, &(n, all))) in sessions.iter_mut().zip(&step).enumerate() {
            if n == 0 {
                continue;
            }
            let tokens = &SEQ[i][at[i]..at[i] + n];
            at[i] += n;
            if batched {
                items.push(BatchItem {
                    session: s,
                    tokens,
                    all,
                });
                who.push(i);
            } else {
                let pos = s.pos();
                let logits = match all {
                    true => s.eval_all(tokens, pos),
                    false => s.eval_prompt(tokens, pos),
                };
                out[i].push(logits.unwrap());
            }
        }
        if batched {
            let logits = model.eval_batch(&mut items).unwrap();
            assert_eq!(logits.len(), who.len());
            for (i, l) in who.into_iter().zip(logits) {
                out[i].push(l);
            }
        }
    }
    for (s, n) in sessions.iter().zip(at) {
        assert_eq!(s.pos(), n);
    }
    out
}

fn same_logits(name: &str, model: &Model, tol: f64) {
    let worst = close(
        name,
        "batched vs alone",
        &run(model, true),
        &run(model, false),
        model.n_vocab(),
        tol,
    );
    eprintln!("{name}: batched vs alone, worst relative L2 {worst:.2e}");
}

/// Every row of logits of `got` within `tol` (relative L2) of `want`'s,
/// with the same argmax; the worst error.
fn close(name: &str, what: &str, got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>], vocab: usize, tol: f64) -> f64 {
    let mut worst = 0.0f64;
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert_eq!(a.len(), b.len());
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.len(), y.len(), "{name}: sequence {i} step {step}: logits length");
            for (row, (xr, yr)) in x.chunks(vocab).zip(y.chunks(vocab)).enumerate() {
                let e = rel_l2(yr, xr);
                worst = worst.max(e);
                assert!(
                    e <= tol,
                    "{name}: sequence {i} step {step} row {row}: {what} {e:.3e} > {tol:e}"
                );
                assert_eq!(
                    argmax(xr),
                    argmax(yr),
                    "{name}: sequence {i} step {step} row {row}: argmax"
                );
            }
        }
    }
    worst
}

/// One forward pass of every session, each with its tokens (the last
/// token's logits of each).
fn step_all(model: &Model, sessions: &mut [Session], tokens: &[impl AsRef<[u32]>]) -> Vec<Vec<f32>> {
    let mut items: Vec<BatchItem> = sessions
        .iter_mut()
        .zip(tokens)
        .map(|(session, t)| BatchItem {
            session,
            tokens: t.as_ref(),
            all: false,
        })
        .collect();
    model.eval_batch(&mut items).unwrap()
}

/// Greedy decoding of three prompts of different lengths, together and
/// alone: the same tokens.
fn same_greedy_tokens(name: &str, model: &Model) {
    let prompts: [&[u32]; 3] = [&SEQ[0][..7], &SEQ[1][..2], &SEQ[2][..4]];
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut s = model.session().unwrap();
            let mut l = s.eval_prompt(p, 0).unwrap();
            let mut toks = Vec::new();
            for _ in 0..8 {
                let t = argmax(&l) as u32;
                toks.push(t);
                let pos = s.pos();
                l = s.eval_token(t, pos).unwrap();
            }
            toks
        })
        .collect();
    let mut sessions: Vec<Session> = (0..3).map(|_| model.session().unwrap()).collect();
    let mut next: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut got = vec![Vec::new(); 3];
    for _ in 0..8 {
        let logits = step_all(model, &mut sessions, &next);
        for (i, l) in logits.iter().enumerate() {
            let t = argmax(l) as u32;
            got[i].push(t);
            next[i] = vec![t];
        }
    }
    assert_eq!(got, alone, "{name}: greedy tokens batched vs alone");
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: Some(n),
        ..SamplingParams::default()
    }
}

/// Prompts of 9, 2 and 5 tokens (the first longer than the step budget
/// of `scheduler_matches_alone`).
fn prompts() -> [Vec<u32>; 3] {
    [SEQ[0][..9].to_vec(), SEQ[1][..2].to_vec(), SEQ[2][..5].to_vec()]
}

fn request(prompt: &[u32], logprobs: bool) -> Request<'_> {
    Request {
        logprobs: logprobs.then_some(2),
        ..Request::new(prompt, greedy(6))
    }
}

/// The scheduler (`generate::Batch`: chunked prefill beside decodes, a
/// step budget of 4 tokens) generates what each request generates alone,
/// piece for piece; a generation cancelled part-way ends as cancelled and
/// leaves the others as they were.
fn scheduler_matches_alone(name: &str, model: &Model) {
    let prompts = prompts();
    let alone: Vec<Generation> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut s = model.session().unwrap();
            let stream = TextStream::ids(&[], &greedy(6));
            let mut g = Generator::start_with_stream(&mut s, stream, request(p, i == 0)).unwrap();
            while g.next_piece().unwrap().is_some() {}
            g.finish().unwrap()
        })
        .collect();
    for cancel_at in [None, Some(3)] {
        let mut sessions: Vec<Session> = (0..3).map(|_| model.session().unwrap()).collect();
        let mut batch = Batch::new(4);
        for (i, (s, p)) in sessions.iter_mut().zip(&prompts).enumerate() {
            let stream = TextStream::ids(&[], &greedy(6));
            let g = Generator::begin(s, stream, request(p, i == 0))
                .map_err(|(e, _)| e)
                .unwrap();
            batch.add(i as u64, g);
        }
        let mut text: HashMap<u64, String> = HashMap::new();
        let mut done: HashMap<u64, Generation> = HashMap::new();
        let mut steps = 0;
        while !batch.is_empty() {
            steps += 1;
            assert!(steps < 100, "{name}: the batch does not end");
            for ev in batch.step(model, |id| id == 1 && cancel_at.is_some_and(|c| steps >= c)) {
                match ev {
                    BatchEvent::Piece { id, text: t, .. } => text.entry(id).or_default().push_str(&t),
                    BatchEvent::Done { id, result, session } => {
                        let g = (*result).unwrap();
                        assert_eq!(
                            session.tokens(),
                            Some(&g.session_tokens[..]),
                            "{name}: {id}: session tokens"
                        );
                        done.insert(id, g);
                    }
                }
            }
        }
        for (i, want) in alone.iter().enumerate() {
            let got = &done[&(i as u64)];
            assert_eq!(
                got.text,
                text.get(&(i as u64)).cloned().unwrap_or_default(),
                "{name}: {i}: pieces"
            );
            if i == 1 && cancel_at.is_some() {
                assert_eq!(got.finish, Finish::Cancelled, "{name}: the cancelled one");
                assert!(want.tokens.starts_with(&got.tokens), "{name}: cancelled part differs");
                continue;
            }
            assert_eq!(got.tokens, want.tokens, "{name}: {i}: tokens, batched vs alone");
            assert_eq!(got.text, want.text, "{name}: {i}: text");
            assert_eq!(got.finish, want.finish, "{name}: {i}: finish");
            assert_eq!(got.logprobs.len(), want.logprobs.len(), "{name}: {i}: logprobs");
        }
    }
}

fn check(name: &str, flags: &[&str], device: Device, tol: f64, exact: bool) {
    let dir = packed_with(name, flags);
    let model = open_with(&dir, device, exact);
    same_logits(name, &model, tol);
    same_greedy_tokens(name, &model);
    scheduler_matches_alone(name, &model);
    if device == Device::Cpu {
        read_ahead_same_bits(name, &dir, &model);
    }
    if device != Device::Cpu {
        streamed_same_bits(name, &dir, &model, exact);
        if exact {
            streamed_on_cpu_close(name, &dir, &model, tol);
            many_decodes_on_cpu_close(name, &dir, &model, tol);
        }
    }
}

/// Eight sequences' decode steps on the CPU with experts read by
/// O_DIRECT through a RAM tier of half of them, each step reading the
/// next MoE layer's guesses for all eight tokens ahead (where the
/// filesystem takes O_DIRECT): the logits of the default reads, bit for
/// bit.
fn read_ahead_same_bits(name: &str, dir: &std::path::Path, plain: &Model) {
    use moeflux::experts::{CacheSize, IoMode};
    let opts = Options {
        device: Device::Cpu,
        exact: true,
        io_mode: IoMode::Direct,
        ram_cache: CacheSize::Percent(50.0),
        ..Options::default()
    };
    let direct = Model::open(dir, &opts).unwrap_or_else(|e| panic!("{name}: open with O_DIRECT: {e}"));
    let (got, want) = (eight_decodes(&direct), eight_decodes(plain));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (step, (a, b)) in g.iter().zip(w).enumerate() {
            let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{name}: sequence {i}, step {step}: logits differ with reads ahead"
            );
        }
    }
    let store = direct.expert_store();
    if store.mode() == IoMode::Direct && store.layout().layers.len() >= 2 {
        let ahead = store.ahead_stats().expect("reads ahead are on with O_DIRECT");
        assert!(
            ahead.read > 0,
            "{name}: no guess was read ahead in batched steps: {ahead:?}"
        );
    }
}

/// `SCHEDULE` with every expert missing from a small cache computed on the
/// CPU in its decode steps (one token of each sequence in the step: those
/// split; `--hybrid cpu`, exact kernels; the CPU's sums added on the
/// device by `add_when`) against the resident run: within `tol`, the same
/// argmax. The cache holds 4·k slots (a step whose distinct experts
/// outnumber the slots is copied in launches, never split), far fewer
/// than the model's experts.
fn streamed_on_cpu_close(name: &str, dir: &std::path::Path, resident: &Model, tol: f64) {
    let k = resident.config().num_experts_per_tok as u64;
    let streamed = open_cpu_misses(name, dir, resident, (4 * k).max(3));
    let (got, want) = (run(&streamed, true), run(resident, true));
    let worst = close(
        name,
        "misses on the CPU vs resident",
        &got,
        &want,
        resident.n_vocab(),
        tol,
    );
    let on_host = streamed.expert_cache_stats().map_or(0, |s| s.on_host);
    assert!(on_host > 0, "{name}: no miss was computed on the CPU");
    eprintln!("{name}: batched, misses on the CPU vs resident, worst relative L2 {worst:.2e} ({on_host} on the CPU)");
}

/// The fixture on CUDA with an expert cache of `n` slots that does not
/// hold every expert, every miss of a step that splits computed on the
/// CPU (`--hybrid cpu`), exact kernels.
fn open_cpu_misses(name: &str, dir: &std::path::Path, resident: &Model, n: u64) -> Model {
    let opts = Options {
        device: Device::Cuda(0),
        exact: true,
        expert_cache: slots(resident, n),
        hybrid: Some(moeflux::experts::Hybrid::Cpu),
        ..Options::default()
    };
    let streamed = Model::open(dir, &opts).unwrap_or_else(|e| panic!("{name}: open with {n} slots of cache: {e}"));
    assert!(
        !streamed.expert_cache().expect("a cache report").resident,
        "{name}: {n} slots of cache hold every expert"
    );
    streamed
}

/// Eight sequences: each prompt (two tokens of `SEQ`'s rows, alone), then
/// three decode steps of all eight together (one token each); each
/// sequence's logits of every step.
fn eight_decodes(model: &Model) -> Vec<Vec<Vec<f32>>> {
    let toks = |i: usize, j: usize| SEQ[i % 3][(4 * (i / 3) + j) % 12];
    let mut sessions: Vec<Session> = (0..8).map(|_| model.session().unwrap()).collect();
    let mut out = vec![Vec::new(); 8];
    for (i, s) in sessions.iter_mut().enumerate() {
        out[i].push(s.eval_prompt(&[toks(i, 0), toks(i, 1)], 0).unwrap());
    }
    for step in 0..3 {
        let tokens: Vec<[u32; 1]> = (0..8).map(|i| [toks(i, 2 + step)]).collect();
        for (o, l) in out.iter_mut().zip(step_all(model, &mut sessions, &tokens)) {
            o.push(l);
        }
    }
    out
}

/// Decode steps of eight sequences (8-token steps: split since they are
/// decode steps of at most 16) with every miss computed on the CPU
/// (`--hybrid cpu`, exact kernels), the cache holding a layer's experts
/// (so that a step's distinct experts fit at once and the step splits)
/// and far fewer than the model's, against the resident run's same
/// steps: within `tol`, the same argmax.
fn many_decodes_on_cpu_close(name: &str, dir: &std::path::Path, resident: &Model, tol: f64) {
    let e = resident.config().num_experts as u64;
    let streamed = open_cpu_misses(name, dir, resident, e);
    let before = streamed.expert_cache_stats().map_or(0, |s| s.on_host);
    let (got, want) = (eight_decodes(&streamed), eight_decodes(resident));
    let worst = close(
        name,
        "eight sequences' decode steps, misses on the CPU, vs resident",
        &got,
        &want,
        resident.n_vocab(),
        tol,
    );
    let on_host = streamed.expert_cache_stats().map_or(0, |s| s.on_host) - before;
    assert!(
        on_host > 0,
        "{name}: no miss of the 8-token steps was computed on the CPU"
    );
    eprintln!(
        "{name}: eight decodes, misses on the CPU vs resident, worst relative L2 {worst:.2e} ({on_host} on the CPU)"
    );
}

/// The batched steps with every expert missing from a three-slot cache
/// (the host's groups of pairs) against the resident run (each pair found
/// on the device): bit-identical logits (SPEC §6, cache hit vs miss).
fn streamed_same_bits(name: &str, dir: &std::path::Path, resident: &Model, exact: bool) {
    let opts = Options {
        device: Device::Cuda(0),
        exact,
        expert_cache: three_slots(resident),
        hybrid: Some(moeflux::experts::Hybrid::Off),
        ..Options::default()
    };
    let streamed = Model::open(dir, &opts).expect("open with a three-slot cache");
    assert!(
        !streamed.expert_cache().expect("a cache report").resident,
        "{name}: three slots hold every expert"
    );
    let bits = |v: &Vec<Vec<Vec<f32>>>| -> Vec<u32> { v.iter().flatten().flatten().map(|x| x.to_bits()).collect() };
    assert!(
        bits(&run(&streamed, true)) == bits(&run(resident, true)),
        "{name}: batched logits with streamed experts differ from the resident run"
    );
}

/// Bad items are refused before anything runs: no session moves.
fn refuses_bad_items() {
    let model = open_cpu(&packed("qwen3_moe"));
    let other = open_cpu(&packed("qwen3_moe"));
    let mut a = model.session().unwrap();
    let mut b = model.session().unwrap();
    let mut c = other.session().unwrap();
    a.eval_prompt(&SEQ[0][..3], 0).unwrap();
    let cases: [(&[u32], &str); 2] = [(&[], "no tokens"), (&[1, 100_000], "out of range")];
    for (bad, what) in cases {
        let mut items = [
            BatchItem {
                session: &mut a,
                tokens: &SEQ[0][3..5],
                all: false,
            },
            BatchItem {
                session: &mut b,
                tokens: bad,
                all: false,
            },
        ];
        let e = model.eval_batch(&mut items).unwrap_err();
        match what {
            "no tokens" => assert!(matches!(e, Error::Invalid(_)), "{e}"),
            _ => assert!(matches!(e, Error::TokenOutOfRange { token: 100_000, .. }), "{e}"),
        }
        assert_eq!((a.pos(), b.pos()), (3, 0), "{what}: a session moved");
    }
    let mut items = [BatchItem {
        session: &mut c,
        tokens: &SEQ[0][..2],
        all: false,
    }];
    let e = model.eval_batch(&mut items).unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
    assert!(model.eval_batch(&mut []).unwrap().is_empty());
}

fn main() {
    let mut all = vec![trials::plain("refuses_bad_items", refuses_bad_items)];
    macro_rules! batch_trials {
        ($name:ident, $fixture:expr, $flags:expr) => {
            all.push(trials::plain(concat!("cpu_", stringify!($name)), || {
                check($fixture, $flags, Device::Cpu, CPU_TOL, true)
            }));
            all.push(trials::cuda(concat!("cuda_", stringify!($name)), || {
                check($fixture, $flags, Device::Cuda(0), CUDA_TOL, true)
            }));
            all.push(trials::cuda(concat!("cuda_fast_", stringify!($name)), || {
                check($fixture, $flags, Device::Cuda(0), CUDA_TOL, false)
            }));
        };
    }
    crate::for_each_golden_fixture!(batch_trials!());
    trials::run(all)
}
