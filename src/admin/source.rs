//! What the admin endpoint shows: a registry's breakers, or a set of
//! breakers, and where each hears of transitions.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use tokio::sync::broadcast;

use crate::events::{self, Observer, Origin, Transition};
use crate::registry::Registry;
use crate::{Breaker, BreakerGroup};

/// How many transitions the process-wide channel of a set of breakers
/// holds for its slowest reader: a client further behind is dropped.
pub(super) const SET_BUFFER: usize = 1024;

/// The breakers an [`Admin`](super::Admin) shows: made from a
/// [`Registry`] (every key it holds at each request, keys made later
/// included), or from breakers (a [`Breaker`], a `Vec` or an array of them,
/// a [`BreakerGroup`]).
#[derive(Clone)]
pub struct Source(Kind);

#[derive(Clone)]
enum Kind {
    Registry(Arc<dyn Keyed>),
    Set {
        breakers: Arc<[Breaker]>,
        members: Arc<HashSet<Origin>>,
    },
}

/// A registry, whatever its key type.
trait Keyed: Send + Sync + 'static {
    fn breakers(&self) -> Vec<Breaker>;
    fn subscribe(&self) -> broadcast::Receiver<Transition>;
    fn len(&self) -> usize;
    /// The names of the parents of `of`, by the registry's parent function.
    fn parents(&self, of: &[&Breaker]) -> Vec<Option<String>>;
}

impl<K> Keyed for Registry<K>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    fn breakers(&self) -> Vec<Breaker> {
        Registry::breakers(self)
            .into_iter()
            .map(|(_, breaker)| breaker)
            .collect()
    }

    fn subscribe(&self) -> broadcast::Receiver<Transition> {
        Registry::subscribe(self)
    }

    fn len(&self) -> usize {
        Registry::len(self)
    }

    fn parents(&self, of: &[&Breaker]) -> Vec<Option<String>> {
        let mut parents = vec![None; of.len()];
        if !self.has_parents() {
            return parents;
        }
        // Breakers are found by identity, keys by one pass over the
        // registry: a page's parents cost what listing it does.
        let wanted: HashMap<Origin, usize> = of
            .iter()
            .enumerate()
            .map(|(i, b)| (b.shared.origin(), i))
            .collect();
        for (key, breaker) in Registry::breakers(self) {
            if let Some(&i) = wanted.get(&breaker.shared.origin()) {
                parents[i] = self.parent_key(&key).map(|parent| parent.to_string());
            }
        }
        parents
    }
}

/// Where a client's stream reads transitions, and which of them are its
/// source's.
pub(super) struct Feed {
    pub(super) receiver: broadcast::Receiver<Transition>,
    /// For a set of breakers: the breakers in it (the channel carries
    /// every breaker of the process, and breakers may share a name).
    /// `None` for a registry's own channel.
    pub(super) members: Option<Arc<HashSet<Origin>>>,
}

impl Feed {
    /// Whether `transition` is one of the source's breakers'.
    pub(super) fn is_ours(&self, transition: &Transition) -> bool {
        self.members
            .as_ref()
            .is_none_or(|members| members.contains(&transition.origin))
    }
}

impl Source {
    fn set(breakers: impl IntoIterator<Item = Breaker>) -> Self {
        let breakers: Arc<[Breaker]> = breakers.into_iter().collect();
        // The set holds its breakers, so no other breaker alive has the
        // origin of one of them.
        let members = breakers.iter().map(|b| b.shared.origin()).collect();
        // Installed now, so that transitions from here on are heard.
        every_transition();
        Source(Kind::Set {
            breakers,
            members: Arc::new(members),
        })
    }

    /// Every breaker, as of now.
    pub(super) fn breakers(&self) -> Vec<Breaker> {
        match &self.0 {
            Kind::Registry(registry) => registry.breakers(),
            Kind::Set { breakers, .. } => breakers.to_vec(),
        }
    }

    /// The names of the parents of `of`: a registry's parent function's
    /// (none for a set of breakers).
    pub(super) fn parents(&self, of: &[&Breaker]) -> Vec<Option<String>> {
        match &self.0 {
            Kind::Registry(registry) => registry.parents(of),
            Kind::Set { .. } => vec![None; of.len()],
        }
    }

    /// The breaker named `name`, if the source has one.
    pub(super) fn find(&self, name: &str) -> Option<Breaker> {
        match &self.0 {
            // A registry is keyed by `K`, not by name: an admin request
            // may scan it (10,000 breakers take well under a millisecond).
            Kind::Registry(registry) => registry.breakers().into_iter().find(|b| b.name() == name),
            Kind::Set { breakers, .. } => breakers.iter().find(|b| b.name() == name).cloned(),
        }
    }

    /// A new reader of the source's transitions, from now on.
    pub(super) fn subscribe(&self) -> Feed {
        match &self.0 {
            Kind::Registry(registry) => Feed {
                receiver: registry.subscribe(),
                members: None,
            },
            Kind::Set { members, .. } => Feed {
                receiver: every_transition().subscribe(),
                members: Some(Arc::clone(members)),
            },
        }
    }
}

/// The channel every transition of the process goes to, once the first
/// set of breakers is shown: an observer that sends without waiting.
fn every_transition() -> &'static broadcast::Sender<Transition> {
    static CHANNEL: OnceLock<broadcast::Sender<Transition>> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        let (sender, _) = broadcast::channel(SET_BUFFER);
        events::observe(Arc::new(Forward(sender.clone())));
        sender
    })
}

/// Forwards each transition to [`every_transition`]'s channel.
struct Forward(broadcast::Sender<Transition>);

impl Observer for Forward {
    fn transition(&self, transition: &Transition) {
        // No reader is no error: nobody is watching right now.
        let _ = self.0.send(transition.clone());
    }
}

impl<K> From<Registry<K>> for Source
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    fn from(registry: Registry<K>) -> Self {
        Source(Kind::Registry(Arc::new(registry)))
    }
}

impl<K> From<&Registry<K>> for Source
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    fn from(registry: &Registry<K>) -> Self {
        Source::from(registry.clone())
    }
}

impl From<Breaker> for Source {
    fn from(breaker: Breaker) -> Self {
        Source::set([breaker])
    }
}

impl From<&Breaker> for Source {
    fn from(breaker: &Breaker) -> Self {
        Source::set([breaker.clone()])
    }
}

impl From<Vec<Breaker>> for Source {
    fn from(breakers: Vec<Breaker>) -> Self {
        Source::set(breakers)
    }
}

impl<const N: usize> From<[Breaker; N]> for Source {
    fn from(breakers: [Breaker; N]) -> Self {
        Source::set(breakers)
    }
}

impl From<BreakerGroup> for Source {
    fn from(group: BreakerGroup) -> Self {
        Source::set(group.breakers().iter().cloned())
    }
}

impl From<&BreakerGroup> for Source {
    fn from(group: &BreakerGroup) -> Self {
        Source::set(group.breakers().iter().cloned())
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Registry(registry) => f
                .debug_struct("Source::Registry")
                .field("keys", &registry.len())
                .finish(),
            Kind::Set { breakers, .. } => f
                .debug_struct("Source::Breakers")
                .field("breakers", &breakers.len())
                .finish(),
        }
    }
}
