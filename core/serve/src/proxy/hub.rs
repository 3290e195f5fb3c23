//! The proxy's sessions: each an episode of the run, reached by its key.
//!
//! An episode opens a session ([`Hub::open`]) and serves its calls from the receiver it gets.
//! A program the episode starts is handed the key; an agent that runs elsewhere gets a
//! session from `/rl/start_session` ([`Hub::attach`]), which takes the oldest episode waiting
//! for one ([`Hub::wait_for_agent`]): the run's staleness rule admits episodes, so when none
//! waits the run has no room and the answer is 429.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot};

use super::openai::{Answer, Asked};

/// What the HTTP side asks of a session's episode.
pub(crate) enum Call {
    /// A turn.
    Chat {
        asked: Asked,
        reply: oneshot::Sender<Result<Answer, Refusal>>,
    },
    /// `/rl/set_reward`.
    SetReward {
        reward: f64,
        interaction_id: Option<String>,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    /// `/rl/end_session`.
    End { reply: oneshot::Sender<()> },
}

/// A call refused by the episode: the HTTP status and what to say.
#[derive(Clone, Debug)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    pub(crate) message: String,
    pub(crate) param: Option<String>,
    /// OpenAI's `code` (`context_length_exceeded`), where it has one.
    pub(crate) code: Option<&'static str>,
}

impl Refusal {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The same, naming the request's field `param`.
    pub(crate) fn on(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }
}

/// A session's way in: its id, key and the episode's queue of calls.
struct Entry {
    id: String,
    calls: mpsc::Sender<Call>,
}

/// A session an episode holds: its id and key, and its calls.
pub(crate) struct Opened {
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) calls: mpsc::Receiver<Call>,
}

/// What `/rl/start_session` gives an agent.
pub(crate) struct Attached {
    pub(crate) session_id: String,
    pub(crate) api_key: String,
    /// The episode's task item (JSON).
    pub(crate) item: serde_json::Value,
}

/// An episode waiting for an agent from elsewhere: it is told the task id the agent named.
struct Waiting {
    key: String,
    id: String,
    item: serde_json::Value,
    told: oneshot::Sender<Option<String>>,
}

/// Sessions by key, ended ones remembered (bounded) so that a late call is told why.
#[derive(Default)]
pub(crate) struct Hub {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    by_key: HashMap<String, Entry>,
    ended: VecDeque<String>,
    waiting: VecDeque<Waiting>,
    /// Why no agent will come any more (the agent service ended), once that is so.
    shut: Option<String>,
}

/// How many ended sessions' keys are remembered.
const ENDED_KEPT: usize = 4096;

/// `prefix` and 24 random bytes from the system's generator, in hex.
pub(crate) fn random_id(prefix: &str) -> String {
    let bytes: [u8; 24] = crate::security::random_bytes();
    let mut out = String::with_capacity(prefix.len() + 48);
    out.push_str(prefix);
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

impl Hub {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("proxy sessions lock poisoned")
    }

    /// A new session, its calls queued up to `depth`.
    pub(crate) fn open(&self, depth: usize) -> Opened {
        let (tx, rx) = mpsc::channel(depth.max(1));
        let id = random_id("sess-");
        let key = random_id("sk-sess-");
        self.lock().by_key.insert(
            key.clone(),
            Entry {
                id: id.clone(),
                calls: tx,
            },
        );
        Opened { id, key, calls: rx }
    }

    /// Session `key` ended: later calls are told so.
    pub(crate) fn close(&self, key: &str) {
        let mut state = self.lock();
        state.waiting.retain(|w| w.key != key);
        if state.by_key.remove(key).is_some() {
            state.ended.push_back(key.to_owned());
            if state.ended.len() > ENDED_KEPT {
                state.ended.pop_front();
            }
        }
    }

    /// The queue of session `key`'s episode, or why there is none.
    pub(crate) fn calls(&self, key: &str) -> Result<(String, mpsc::Sender<Call>), Refusal> {
        let state = self.lock();
        match state.by_key.get(key) {
            Some(entry) => Ok((entry.id.clone(), entry.calls.clone())),
            None if state.ended.iter().any(|k| k == key) => {
                Err(Refusal::new(410, "this session has ended"))
            }
            None => Err(Refusal::new(
                401,
                "no session has this key: start one with /rl/start_session, or use the key a \
                 program was given in OPENAI_API_KEY",
            )),
        }
    }

    /// Episode session `opened` (for task item `item`) waits for an agent from elsewhere;
    /// resolves with the task id the agent named once one attaches, or fails with why none
    /// will ([`shut`](Self::shut)).
    pub(crate) async fn wait_for_agent(
        &self,
        opened: &Opened,
        item: serde_json::Value,
    ) -> Result<Option<String>, String> {
        let (told, rx) = oneshot::channel();
        {
            let mut state = self.lock();
            if let Some(why) = &state.shut {
                return Err(why.clone());
            }
            state.waiting.push_back(Waiting {
                key: opened.key.clone(),
                id: opened.id.clone(),
                item,
                told,
            });
        }
        rx.await.map_err(|_| {
            self.lock()
                .shut
                .clone()
                .unwrap_or_else(|| "the proxy stopped".into())
        })
    }

    /// No agent will come any more, because of `why`: the episodes waiting and to come fail
    /// with it. False when that was so already (the first reason stands).
    pub(crate) fn shut(&self, why: String) -> bool {
        let mut state = self.lock();
        state.waiting.clear();
        if state.shut.is_some() {
            return false;
        }
        state.shut = Some(why);
        true
    }

    /// Give an agent from elsewhere the oldest waiting session, or `None` when no episode
    /// waits (the run admits no more).
    pub(crate) fn attach(&self, task_id: Option<String>) -> Option<Attached> {
        let mut state = self.lock();
        while let Some(waiting) = state.waiting.pop_front() {
            if waiting.told.send(task_id.clone()).is_ok() {
                return Some(Attached {
                    session_id: waiting.id,
                    api_key: waiting.key,
                    item: waiting.item,
                });
            }
        }
        None
    }

    /// Sessions open now, and of them those waiting for an agent from elsewhere.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.by_key.len(), state.waiting.len())
    }
}
