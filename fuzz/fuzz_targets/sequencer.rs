//! `Sequencer`'s text form (`lockline1:MODE:TOKEN:NAME`), as a resource
//! receives it from anyone: parsing never panics and refuses with
//! `InvalidOptions`; whatever parses prints back to text that parses to the
//! same sequencer, visible ASCII only; and any sequencer built from the input
//! (any non-empty name, any mode, any token) round-trips through its text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockline::{FencingToken, Mode, Sequencer};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<Sequencer>() {
        Ok(sequencer) => {
            assert!(!sequencer.name().is_empty());
            let printed = sequencer.to_string();
            assert!(printed.bytes().all(|b| b.is_ascii_graphic()), "{printed:?}");
            assert_eq!(printed.parse::<Sequencer>().expect("printed form parses"), sequencer);
        }
        Err(lockline::Error::InvalidOptions { .. }) => {}
        Err(other) => panic!("{text:?}: not InvalidOptions: {other:?}"),
    }

    // Encode, then decode: the input as the name of every mode.
    if text.is_empty() {
        return;
    }
    let token = data.iter().fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b));
    let permits = usize::from(data[0]).max(1) << (data.len() % 48);
    for mode in [
        Mode::Mutex,
        Mode::Read,
        Mode::Write,
        Mode::Permit { permits },
        Mode::Permit { permits: usize::MAX },
        Mode::Leadership,
    ] {
        for token in [token, 0, u64::MAX] {
            let sequencer = Sequencer::new(text, mode, FencingToken::new(token));
            let printed = sequencer.to_string();
            assert!(printed.bytes().all(|b| b.is_ascii_graphic()), "{printed:?}");
            assert_eq!(
                printed.parse::<Sequencer>().expect("round trip"),
                sequencer,
                "{printed}"
            );
        }
    }
});
