//! Per-user quotas: [`UserQuotas`] (the share of each cluster-wide budget
//! one user may hold, and the reserve kept for admins), [`Holder`] (whom a
//! request is charged to) and [`UsageByOwner`] (what each user holds, a
//! derived count kept beside the sessions and the idempotency keys).
//!
//! The cluster-wide budgets are `sessions_max`, `record_bytes_max`,
//! `idempotency_keys_max` and `idempotency_bytes_max`. While
//! authentication is enforced, a user without the admin role may hold at
//! most its share of each, and all such users together may fill each only
//! up to what the admin reserve leaves: one user filling its share refuses
//! only that user, and admins can still act when every user is full.

use crate::ids::Principal;
use imbl::OrdMap;
use serde::{Deserialize, Serialize};

/// The shares of the cluster-wide budgets (a cluster setting, written in
/// snapshots since format 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserQuotas {
    /// The percentage of each budget one non-admin user may hold (1..=100).
    pub user_share_percent: u8,
    /// The percentage of each budget kept for admins (0..=90): non-admin
    /// requests are refused once the rest is used.
    pub admin_reserve_percent: u8,
}

impl Default for UserQuotas {
    fn default() -> Self {
        UserQuotas {
            user_share_percent: 25,
            admin_reserve_percent: 10,
        }
    }
}

/// Why a quota setting is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidQuotas {
    /// The user share is out of range.
    #[error("the user share is {0}%; it must be 1..=100%")]
    UserShare(u8),
    /// The admin reserve is out of range.
    #[error("the admin reserve is {0}%; it must be 0..=90%")]
    AdminReserve(u8),
}

impl UserQuotas {
    /// Checks the percentages' ranges.
    pub fn check(&self) -> Result<(), InvalidQuotas> {
        if !(1..=100).contains(&self.user_share_percent) {
            return Err(InvalidQuotas::UserShare(self.user_share_percent));
        }
        if self.admin_reserve_percent > 90 {
            return Err(InvalidQuotas::AdminReserve(self.admin_reserve_percent));
        }
        Ok(())
    }

    /// What one non-admin user may hold of a budget of `max`: its share,
    /// rounded up, and at least 1 of a budget that admits anything.
    pub fn user_share(&self, max: u64) -> u64 {
        let share = (u128::from(max) * u128::from(self.user_share_percent)).div_ceil(100);
        u64::try_from(share).unwrap_or(max).clamp(max.min(1), max)
    }

    /// What all non-admin users together may fill of a budget of `max`:
    /// the budget less the admin reserve (rounded down), at least 1 of a
    /// budget that admits anything.
    pub fn without_reserve(&self, max: u64) -> u64 {
        let reserve = u128::from(max) * u128::from(self.admin_reserve_percent.min(90)) / 100;
        let reserve = u64::try_from(reserve).unwrap_or(0);
        max.saturating_sub(reserve).max(max.min(1))
    }
}

/// Whom a request is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    /// An admin, or anyone while authentication is off: the whole budgets.
    Admin,
    /// A user without the admin role: its share, within the budgets less
    /// the admin reserve (no share without a principal, which only a
    /// session opened while authentication was off has).
    User(Option<&'a Principal>),
}

impl Holder<'_> {
    /// The cluster-wide bound that applies to this holder of a budget of
    /// `max`.
    pub fn total_max(&self, quotas: &UserQuotas, max: u64) -> u64 {
        match self {
            Holder::Admin => max,
            Holder::User(_) => quotas.without_reserve(max),
        }
    }

    /// This holder's own share of a budget of `max`, if it has one.
    pub fn share(&self, quotas: &UserQuotas, max: u64) -> Option<u64> {
        match self {
            Holder::User(Some(_)) => Some(quotas.user_share(max)),
            Holder::Admin | Holder::User(None) => None,
        }
    }
}

/// What one owner holds of a table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// How many entries (sessions, or idempotency keys).
    pub count: u64,
    /// How many bytes of records.
    pub bytes: u64,
}

/// What each owner holds (derived; an owner holding nothing is not
/// listed, so two tables with the same entries compare equal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageByOwner(OrdMap<Principal, Usage>);

impl UsageByOwner {
    /// What `owner` holds.
    pub fn of(&self, owner: &Principal) -> Usage {
        self.0.get(owner).copied().unwrap_or_default()
    }

    /// Every owner holding anything, with what it holds.
    pub fn iter(&self) -> impl Iterator<Item = (&Principal, &Usage)> {
        self.0.iter()
    }

    /// Charges `count` entries and `bytes` to `owner` (nothing without an
    /// owner).
    pub fn add(&mut self, owner: Option<&Principal>, count: u64, bytes: u64) {
        let Some(owner) = owner else { return };
        if count == 0 && bytes == 0 {
            return;
        }
        let usage = self.0.entry(owner.clone()).or_default();
        usage.count += count;
        usage.bytes += bytes;
    }

    /// Releases `count` entries and `bytes` charged to `owner`.
    pub fn sub(&mut self, owner: Option<&Principal>, count: u64, bytes: u64) {
        let Some(owner) = owner else { return };
        if count == 0 && bytes == 0 {
            return;
        }
        let Some(usage) = self.0.get_mut(owner) else {
            return;
        };
        usage.count -= count;
        usage.bytes -= bytes;
        if *usage == Usage::default() {
            self.0.remove(owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_up_and_reserves_round_down() {
        let quotas = UserQuotas {
            user_share_percent: 25,
            admin_reserve_percent: 10,
        };
        assert_eq!(quotas.user_share(100_000), 25_000);
        assert_eq!(quotas.user_share(3), 1);
        assert_eq!(quotas.user_share(0), 0);
        assert_eq!(quotas.user_share(u64::MAX), u64::MAX / 4 + 1);
        assert_eq!(quotas.without_reserve(100), 90);
        assert_eq!(quotas.without_reserve(5), 5);
        assert_eq!(quotas.without_reserve(1), 1);
        assert_eq!(quotas.without_reserve(0), 0);
        assert_eq!(
            UserQuotas {
                user_share_percent: 0,
                admin_reserve_percent: 0
            }
            .check(),
            Err(InvalidQuotas::UserShare(0))
        );
        assert_eq!(
            UserQuotas {
                user_share_percent: 100,
                admin_reserve_percent: 91
            }
            .check(),
            Err(InvalidQuotas::AdminReserve(91))
        );
    }

    #[test]
    fn an_owner_holding_nothing_is_not_listed() {
        let alice = Principal("alice".into());
        let mut usage = UsageByOwner::default();
        usage.add(Some(&alice), 1, 10);
        usage.add(None, 1, 10);
        assert_eq!(
            usage.of(&alice),
            Usage {
                count: 1,
                bytes: 10
            }
        );
        usage.sub(Some(&alice), 1, 10);
        assert_eq!(usage, UsageByOwner::default());
    }
}
