//! Time windows, and the bucket a moment falls in.
//!
//! A bucket is named by an integer index, computed from the time alone, so
//! every store (in-process, Redis) and every replica names the same bucket
//! the same way. All arithmetic is on integers, for the same reason.

use chrono::{DateTime, Datelike, NaiveDate};

use crate::StateError;

/// The longest window: 31 days, in seconds.
pub const MAX_WINDOW_SECONDS: u32 = 31 * 24 * 60 * 60;

/// The last millisecond windows are computed for: 9999-12-31T23:59:59.999Z.
/// Later times count as this one, so that no arithmetic overflows and the
/// calendar (chrono's) always has the month.
pub const MAX_UNIX_MS: u64 = 253_402_300_799_999;

/// Parts per million: the unit of a sliding window's previous-bucket weight.
pub const PPM: u64 = 1_000_000;

/// The months from 0000-01 to 1970-01, so that 1970-01 is month index 0.
const EPOCH_MONTHS: i64 = 1970 * 12;

/// The bucket of the last month windows are computed for (9999-12), the
/// answer should the calendar ever fail to give one.
const LAST_MONTH: Bucket =
    Bucket { index: (9999 - 1970) * 12 + 11, start_ms: 253_399_622_400_000, end_ms: 253_402_300_800_000 };

/// How counts are grouped in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Window {
    /// Fixed windows of `seconds` (1 ..= 31 days), aligned to the Unix
    /// epoch: a window of 86400 s is the UTC day, one of 3600 s the hour.
    Fixed { seconds: u32 },
    /// The last `seconds`, estimated from two fixed buckets of that length
    /// (aligned as [`Window::Fixed`]'s): the current bucket's count plus the
    /// previous bucket's weighted by the share of it still inside the
    /// window, as Cloudflare and Envoy's local rate limit describe it. The
    /// estimate assumes the previous bucket's counts were spread evenly
    /// over it; see [`Buckets::estimate`] for its rounding and error.
    Sliding { seconds: u32 },
    /// The UTC calendar month.
    CalendarMonth,
}

/// One fixed stretch of time counts are kept in: `start_ms ..end_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bucket {
    /// Buckets since the epoch: `start / length` for fixed lengths, months
    /// since 1970-01 for the calendar month. Consecutive buckets have
    /// consecutive indexes.
    pub index: u64,
    /// The first millisecond in the bucket (Unix time).
    pub start_ms: u64,
    /// The first millisecond after it.
    pub end_ms: u64,
}

/// The buckets a window counts at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buckets {
    /// The bucket holding the moment; new counts go here.
    pub current: Bucket,
    /// For a sliding window, the bucket before (none before the epoch's
    /// first); none for other windows.
    pub previous: Option<Bucket>,
    /// The share of `previous` still inside the window, in parts per
    /// million, rounded up: `ceil((current.end - now) * 10^6 / length)`,
    /// from 10^6 at the current bucket's first millisecond down to
    /// `ceil(10^6 / length)` at its last. 0 when there is no previous bucket.
    pub previous_weight_ppm: u64,
}

impl Buckets {
    /// How much the window holds, given the current bucket's count and the
    /// previous one's: `current + ceil(previous * weight_ppm / 10^6)`,
    /// saturating.
    ///
    /// Both roundings are up, so the estimate is never below the exact
    /// interpolation `current + previous * (end - now) / length`, and above
    /// it by less than `1 + previous / 10^6`: it may refuse a unit early,
    /// never admit one late. Against the true count of the last `length`
    /// milliseconds it is off by as much as the previous bucket's counts
    /// were unevenly spread; whatever their spread, the current bucket
    /// alone never passes the limit, so any span of `length` ms (which
    /// meets at most two buckets) holds at most twice the limit.
    pub fn estimate(&self, current: u64, previous: u64) -> u64 {
        if self.previous.is_none() {
            return current;
        }
        let scaled = u128::from(previous) * u128::from(self.previous_weight_ppm);
        let weighted = scaled.div_ceil(u128::from(PPM));
        // At most `previous`, as the weight is at most 10^6.
        current.saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
    }
}

impl Window {
    /// Refuses a window whose length is not 1 ..= 31 days' seconds.
    pub fn validate(&self) -> Result<(), StateError> {
        match *self {
            Window::Fixed { seconds } | Window::Sliding { seconds } if seconds == 0 || seconds > MAX_WINDOW_SECONDS => {
                Err(StateError::InvalidWindow(*self))
            }
            _ => Ok(()),
        }
    }

    /// The length of a fixed or sliding window's buckets, in milliseconds
    /// (an invalid length taken as the nearest valid one, so that nothing
    /// divides by zero); none for the calendar month, whose length varies.
    pub fn length_ms(&self) -> Option<u64> {
        match *self {
            Window::Fixed { seconds } | Window::Sliding { seconds } => {
                Some(u64::from(seconds.clamp(1, MAX_WINDOW_SECONDS)) * 1000)
            }
            Window::CalendarMonth => None,
        }
    }

    /// The bucket holding `now_unix_ms`.
    pub fn bucket(&self, now_unix_ms: u64) -> Bucket {
        let now = now_unix_ms.min(MAX_UNIX_MS);
        match self.length_ms() {
            Some(length) => {
                let index = now / length;
                let start_ms = index * length;
                Bucket { index, start_ms, end_ms: start_ms + length }
            }
            None => month(now).unwrap_or(LAST_MONTH),
        }
    }

    /// The buckets the window counts at `now_unix_ms`: for a sliding window
    /// the current and previous ones, with the previous one's weight; for
    /// the others, the current one.
    pub fn buckets(&self, now_unix_ms: u64) -> Buckets {
        let now = now_unix_ms.min(MAX_UNIX_MS);
        let current = self.bucket(now);
        let (Window::Sliding { .. }, Some(length)) = (self, self.length_ms()) else {
            return Buckets { current, previous: None, previous_weight_ppm: 0 };
        };
        let Some(index) = current.index.checked_sub(1) else {
            return Buckets { current, previous: None, previous_weight_ppm: 0 };
        };
        let start_ms = current.start_ms.saturating_sub(length);
        let previous = Bucket { index, start_ms, end_ms: current.start_ms };
        // 1 ..= length ms of the previous bucket's span are still inside;
        // at most 2.7e9 * 1e6, well within u64.
        let inside = current.end_ms.saturating_sub(now);
        let previous_weight_ppm = (inside * PPM).div_ceil(length);
        Buckets { current, previous: Some(previous), previous_weight_ppm }
    }

    /// When a refused request may retry: the end of the current bucket.
    /// For a sliding window that is when the previous bucket stops
    /// counting; the current one's counts go on counting, at a weight
    /// falling to 0 over the next window, so a retry then may still be
    /// refused.
    pub fn reset_unix_ms(&self, now_unix_ms: u64) -> u64 {
        self.bucket(now_unix_ms).end_ms
    }

    /// When `bucket` of this window stops counting and its counter can go:
    /// its end, or for a sliding window the end of the bucket after it
    /// (until then it is the previous bucket).
    pub fn expires_unix_ms(&self, bucket: &Bucket) -> u64 {
        match (self, self.length_ms()) {
            (Window::Sliding { .. }, Some(length)) => bucket.end_ms.saturating_add(length),
            _ => bucket.end_ms,
        }
    }
}

/// The calendar month holding `now` (at most [`MAX_UNIX_MS`]).
fn month(now: u64) -> Option<Bucket> {
    let date = DateTime::from_timestamp_millis(i64::try_from(now).ok()?)?.date_naive();
    let (year, month0) = (date.year(), date.month0());
    let (next_year, next_month0) = if month0 == 11 { (year.checked_add(1)?, 0) } else { (year, month0 + 1) };
    let index = i64::from(year) * 12 + i64::from(month0) - EPOCH_MONTHS;
    Some(Bucket {
        index: u64::try_from(index).ok()?,
        start_ms: month_start(year, month0)?,
        end_ms: month_start(next_year, next_month0)?,
    })
}

/// The first millisecond of a month, UTC.
fn month_start(year: i32, month0: u32) -> Option<u64> {
    let first = NaiveDate::from_ymd_opt(year, month0 + 1, 1)?.and_hms_opt(0, 0, 0)?;
    u64::try_from(first.and_utc().timestamp_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: u64 = 86_400_000;

    fn fixed(seconds: u32) -> Window {
        Window::Fixed { seconds }
    }

    #[test]
    fn fixed_windows_align_to_the_epoch() {
        assert_eq!(fixed(60).bucket(0), Bucket { index: 0, start_ms: 0, end_ms: 60_000 });
        // 2024-03-15T12:34:56Z falls in the UTC day starting 2024-03-15T00:00Z.
        let day = fixed(86_400).bucket(1_710_506_096_000);
        assert_eq!(day, Bucket { index: 19_797, start_ms: 1_710_460_800_000, end_ms: 1_710_460_800_000 + DAY_MS });
        let hour = fixed(3600).bucket(1_710_506_096_000);
        assert_eq!(hour.start_ms, 1_710_504_000_000);
        assert_eq!(hour.end_ms, 1_710_507_600_000);
    }

    #[test]
    fn a_buckets_last_millisecond_is_in_it_and_the_next_is_not() {
        let window = fixed(60);
        assert_eq!(window.bucket(59_999).index, 0);
        assert_eq!(window.bucket(60_000), Bucket { index: 1, start_ms: 60_000, end_ms: 120_000 });
        assert_eq!(window.reset_unix_ms(59_999), 60_000);
        assert_eq!(window.reset_unix_ms(60_000), 120_000);
        let second = fixed(1);
        assert_eq!(second.bucket(1_999), Bucket { index: 1, start_ms: 1_000, end_ms: 2_000 });
    }

    /// The month of `first_ms` (its first millisecond) ends at `next_ms`.
    fn assert_month(first_ms: u64, next_ms: u64, index: u64) {
        let expected = Bucket { index, start_ms: first_ms, end_ms: next_ms };
        for now in [first_ms, first_ms + 1, first_ms + (next_ms - first_ms) / 2, next_ms - 1] {
            assert_eq!(Window::CalendarMonth.bucket(now), expected, "at {now}");
            assert_eq!(Window::CalendarMonth.reset_unix_ms(now), next_ms);
        }
        assert_eq!(Window::CalendarMonth.bucket(next_ms).index, index + 1);
        assert_eq!(Window::CalendarMonth.bucket(next_ms).start_ms, next_ms);
    }

    #[test]
    fn calendar_months_end_where_the_calendar_says() {
        assert_eq!(Window::CalendarMonth.bucket(0), Bucket { index: 0, start_ms: 0, end_ms: 31 * DAY_MS });
        // January 2024, and February of a leap year (2024: 29 days).
        assert_month(1_704_067_200_000, 1_706_745_600_000, 648);
        assert_month(1_706_745_600_000, 1_709_251_200_000, 649);
        assert_eq!(1_709_251_200_000 - 1_706_745_600_000, 29 * DAY_MS);
        // February 2025: 28 days.
        assert_month(1_738_368_000_000, 1_740_787_200_000, 661);
        assert_eq!(1_740_787_200_000 - 1_738_368_000_000, 28 * DAY_MS);
        // 2100 is not a leap year (divisible by 100), 2000 is (by 400).
        assert_month(4_105_123_200_000, 4_107_542_400_000, 1561);
        assert_eq!(4_107_542_400_000 - 4_105_123_200_000, 28 * DAY_MS);
        assert_month(949_363_200_000, 951_868_800_000, 361);
        assert_eq!(951_868_800_000 - 949_363_200_000, 29 * DAY_MS);
        // December 2024 ends at the first of January 2025, the next index.
        assert_month(1_733_011_200_000, 1_735_689_600_000, 659);
        assert_eq!(Window::CalendarMonth.bucket(1_735_689_600_000).index, 660);
    }

    #[test]
    fn month_indexes_are_consecutive() {
        let mut now = 0;
        let mut expected = 0;
        while now < 4_197_052_800_000 {
            let bucket = Window::CalendarMonth.bucket(now);
            assert_eq!(bucket.index, expected);
            assert_eq!(bucket.start_ms, now);
            let days = (bucket.end_ms - bucket.start_ms) / DAY_MS;
            assert!((28..=31).contains(&days), "{days} days at {now}");
            now = bucket.end_ms;
            expected += 1;
        }
        // 1970-01 to 2103-01.
        assert_eq!(expected, 133 * 12);
    }

    #[test]
    fn times_past_year_9999_count_as_its_last_millisecond() {
        assert_eq!(Window::CalendarMonth.bucket(MAX_UNIX_MS), LAST_MONTH);
        assert_eq!(Window::CalendarMonth.bucket(u64::MAX), LAST_MONTH);
        assert_eq!(fixed(MAX_WINDOW_SECONDS).bucket(u64::MAX), fixed(MAX_WINDOW_SECONDS).bucket(MAX_UNIX_MS));
        let sliding = Window::Sliding { seconds: 60 }.buckets(u64::MAX);
        assert_eq!(sliding.current.end_ms, MAX_UNIX_MS + 1);
        assert_eq!(sliding.previous_weight_ppm, 1000 / 60 + 1);
    }

    #[test]
    fn sliding_weights_fall_across_the_bucket() {
        let window = Window::Sliding { seconds: 10 };
        // The first millisecond of bucket 5: all of bucket 4 still counts.
        let start = window.buckets(50_000);
        assert_eq!(start.current, Bucket { index: 5, start_ms: 50_000, end_ms: 60_000 });
        assert_eq!(start.previous, Some(Bucket { index: 4, start_ms: 40_000, end_ms: 50_000 }));
        assert_eq!(start.previous_weight_ppm, 1_000_000);
        assert_eq!(window.buckets(55_000).previous_weight_ppm, 500_000);
        assert_eq!(window.buckets(57_500).previous_weight_ppm, 250_000);
        // The last millisecond: 1 ms of 10 000, rounded up.
        assert_eq!(window.buckets(59_999).previous_weight_ppm, 100);
        // 1 ms in 3 s is 333.33 ppm: rounded up, never down.
        assert_eq!(Window::Sliding { seconds: 3 }.buckets(5_999).previous_weight_ppm, 334);
        // Bucket 0 has none before it.
        let first = window.buckets(1);
        assert_eq!((first.previous, first.previous_weight_ppm), (None, 0));
        assert_eq!(first.estimate(7, 1000), 7);
    }

    #[test]
    fn sliding_estimates_round_up() {
        let window = Window::Sliding { seconds: 10 };
        assert_eq!(window.buckets(55_000).estimate(3, 10), 3 + 5);
        assert_eq!(window.buckets(55_000).estimate(3, 11), 3 + 6);
        assert_eq!(window.buckets(50_000).estimate(0, 10), 10);
        assert_eq!(window.buckets(59_999).estimate(0, 10), 1);
        assert_eq!(window.buckets(59_999).estimate(0, 0), 0);
        assert_eq!(window.buckets(50_000).estimate(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(window.buckets(50_000).estimate(0, u64::MAX), u64::MAX);
    }

    #[test]
    fn other_windows_count_one_bucket() {
        for window in [fixed(10), Window::CalendarMonth] {
            let buckets = window.buckets(55_000);
            assert_eq!(buckets.current, window.bucket(55_000));
            assert_eq!(buckets.previous, None);
            assert_eq!(buckets.estimate(4, 100), 4);
        }
    }

    #[test]
    fn buckets_expire_when_they_stop_counting() {
        let bucket = fixed(10).bucket(55_000);
        assert_eq!(fixed(10).expires_unix_ms(&bucket), 60_000);
        assert_eq!(Window::Sliding { seconds: 10 }.expires_unix_ms(&bucket), 70_000);
        let month = Window::CalendarMonth.bucket(1_710_506_096_000);
        assert_eq!(Window::CalendarMonth.expires_unix_ms(&month), 1_711_929_600_000);
    }

    #[test]
    fn windows_outside_1_second_to_31_days_are_refused() {
        for window in [fixed(0), fixed(MAX_WINDOW_SECONDS + 1), Window::Sliding { seconds: 0 }, fixed(u32::MAX)] {
            assert_eq!(window.validate(), Err(StateError::InvalidWindow(window)));
            // Still no division by zero or overflow.
            assert!(window.bucket(123_456).end_ms > 123_456);
        }
        for window in [fixed(1), fixed(MAX_WINDOW_SECONDS), Window::Sliding { seconds: 1 }, Window::CalendarMonth] {
            assert_eq!(window.validate(), Ok(()));
        }
        assert_eq!(MAX_WINDOW_SECONDS, 2_678_400);
    }
}
