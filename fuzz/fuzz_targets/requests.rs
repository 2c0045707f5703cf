//! The differential oracle of tests/it/oracle/, unbounded: libFuzzer's inputs read by holdfast's
//! HTTP/1 request side and by hyper's server must give the same requests, or holdfast must refuse
//! earlier for a reason in its table of deliberate strictness. The first byte chooses how the
//! rest arrives: whole, a byte at a time, or cut in two at a place it names.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../tests/it/oracle/core.rs"]
mod core;

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
}

fuzz_target!(|data: &[u8]| {
    let Some((&how, bytes)) = data.split_first() else {
        return;
    };
    let pieces: Vec<&[u8]> = match how % 3 {
        0 => vec![bytes],
        1 => bytes.chunks(1).collect(),
        _ => {
            let at = usize::from(how) * 7 % (bytes.len() + 1);
            vec![&bytes[..at], &bytes[at..]]
        }
    };
    let ours = core::holdfast_reads(&pieces);
    let theirs = RUNTIME.with(|rt| rt.block_on(core::hyper_reads(&pieces)));
    if let Err(why) = core::compare(&ours, &theirs) {
        panic!("{why}\ninput: {:?}", String::from_utf8_lossy(bytes));
    }
});
