//! What the library has to say while it works (the device it chose, the
//! kernels it compiles, how the expert cache was set up, a fallback it
//! took): handed to a callback of the caller's, never printed by the
//! library. The CLI prints each message on stderr; a library user may log
//! it, show it, or drop it (the default).

use std::sync::Arc;

/// The function a [`Notifier`] calls with each message.
type Callback = Arc<dyn Fn(&str) + Send + Sync>;

/// A callback for the library's messages; `Notifier::default()` drops them.
#[derive(Clone, Default)]
pub struct Notifier(Option<Callback>);

impl Notifier {
    /// Messages go to `f`.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Notifier {
        Notifier(Some(Arc::new(f)))
    }

    /// Hand `msg` to the callback, if there is one.
    pub fn say(&self, msg: &str) {
        if let Some(f) = &self.0 {
            f(msg);
        }
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Notifier(callback)"
        } else {
            "Notifier(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Notifier;
    use std::sync::{Arc, Mutex};

    #[test]
    fn messages_reach_the_callback_and_none_is_silent() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        let n = Notifier::new(move |m| sink.lock().unwrap().push(m.to_string()));
        n.clone().say("a");
        n.say("b");
        assert_eq!(*got.lock().unwrap(), ["a", "b"]);
        Notifier::default().say("dropped");
    }
}
