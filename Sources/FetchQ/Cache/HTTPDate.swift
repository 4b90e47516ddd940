import Glibc

/// HTTP-date (RFC 9110 §5.6.7): parsing the three forms a recipient must accept, and
/// formatting the preferred one. Used by the cache (`Date`, `Expires`, `Last-Modified`)
/// and by the retry policy (`Retry-After`).
///
/// Times are seconds since the Unix epoch (UTC), as `Double` so that they compare
/// directly with `clock_gettime(CLOCK_REALTIME)` readings. No locale is involved: day and
/// month names are matched and written from fixed English tables.
public enum HTTPDate {
    /// Parses an HTTP-date, or returns nil if `text` is not one.
    ///
    /// Accepted forms (leading and trailing spaces/tabs are ignored):
    /// - IMF-fixdate, the preferred form: `Sun, 06 Nov 1994 08:49:37 GMT`
    /// - RFC 850 (obsolete): `Sunday, 06-Nov-94 08:49:37 GMT`. Its two-digit year is read as
    ///   the year with those last two digits at most 50 years in the future, else the most
    ///   recent one in the past (RFC 9110 §5.6.7).
    /// - ANSI C asctime (obsolete): `Sun Nov  6 08:49:37 1994` (the day may be one digit
    ///   after two spaces, or two digits).
    ///
    /// Day and month names are compared case-insensitively; the day name must be a real
    /// one but is not checked against the date (it is redundant). The date must exist
    /// (1 Feb 29 only in leap years), hours 0–23, minutes 0–59, seconds 0–60 (a leap
    /// second, counted as the next minute's first second). Anything else — another time
    /// zone, trailing text, a number out of range — is invalid.
    public static func parse(_ text: String) -> Double? {
        var scanner = Scanner(Array(text.utf8))
        scanner.trimWhitespace()
        guard let fields = parseFields(&scanner) else { return nil }
        return epochSeconds(fields)
    }

    /// Formats `seconds` since the epoch as an IMF-fixdate, e.g.
    /// `Sun, 06 Nov 1994 08:49:37 GMT`. Fractions of a second are dropped (rounded down).
    /// Years outside 0…9999 are written with as many digits as they need.
    public static func format(_ seconds: Double) -> String {
        let whole = seconds.isFinite ? seconds.rounded(.down) : 0
        var time = time_t(max(min(whole, Double(Int64.max / 2)), Double(Int64.min / 2)))
        var parts = tm()
        guard gmtime_r(&time, &parts) != nil else { return "Thu, 01 Jan 1970 00:00:00 GMT" }
        let weekday = dayNames[Int(parts.tm_wday)]
        let month = monthNames[Int(parts.tm_mon)]
        let year = fourDigits(Int(parts.tm_year) + 1900)
        let day = twoDigits(parts.tm_mday)
        let clock =
            "\(twoDigits(parts.tm_hour)):\(twoDigits(parts.tm_min)):\(twoDigits(parts.tm_sec))"
        return "\(weekday), \(day) \(month) \(year) \(clock) GMT"
    }

    // MARK: - Parsing

    static let dayNames = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    static let longDayNames = [
        "Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
    ]
    static let monthNames = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]

    struct Fields {
        var year: Int
        var month: Int  // 1...12
        var day: Int
        var hour: Int
        var minute: Int
        var second: Int
    }

    /// Recognises the form by what follows the day name: `,` then a date with `-` (RFC 850),
    /// `,` then a date with spaces (IMF-fixdate), or a space (asctime).
    private static func parseFields(_ s: inout Scanner) -> Fields? {
        let name = s.letters()
        if s.take(UInt8(ascii: ",")) {
            guard s.take(UInt8(ascii: " ")) else { return nil }
            if s.peek(at: 2) == UInt8(ascii: "-") || s.peek(at: 1) == UInt8(ascii: "-") {
                guard matches(name, longDayNames) != nil else { return nil }
                return parseRFC850(&s)
            }
            guard matches(name, dayNames) != nil else { return nil }
            return parseIMF(&s)
        }
        guard matches(name, dayNames) != nil, s.take(UInt8(ascii: " ")) else { return nil }
        return parseAsctime(&s)
    }

    /// `06 Nov 1994 08:49:37 GMT` (after `Sun, `).
    private static func parseIMF(_ s: inout Scanner) -> Fields? {
        guard let day = s.number(digits: 1...2), s.take(UInt8(ascii: " ")),
            let month = matches(s.letters(), monthNames), s.take(UInt8(ascii: " ")),
            let year = s.number(digits: 4...4), s.take(UInt8(ascii: " ")),
            let (hour, minute, second) = parseTime(&s), s.take(UInt8(ascii: " ")),
            s.takeWord("GMT"), s.atEnd
        else { return nil }
        return Fields(
            year: year, month: month + 1, day: day, hour: hour, minute: minute, second: second)
    }

    /// `06-Nov-94 08:49:37 GMT` (after `Sunday, `).
    private static func parseRFC850(_ s: inout Scanner) -> Fields? {
        guard let day = s.number(digits: 1...2), s.take(UInt8(ascii: "-")),
            let month = matches(s.letters(), monthNames), s.take(UInt8(ascii: "-")),
            let shortYear = s.number(digits: 2...2), s.take(UInt8(ascii: " ")),
            let (hour, minute, second) = parseTime(&s), s.take(UInt8(ascii: " ")),
            s.takeWord("GMT"), s.atEnd
        else { return nil }
        return Fields(
            year: fullYear(shortYear, currentYear: currentYear()), month: month + 1, day: day,
            hour: hour, minute: minute, second: second)
    }

    /// `Nov  6 08:49:37 1994` or `Nov 16 08:49:37 1994` (after `Sun `).
    private static func parseAsctime(_ s: inout Scanner) -> Fields? {
        guard let month = matches(s.letters(), monthNames), s.take(UInt8(ascii: " ")) else {
            return nil
        }
        _ = s.take(UInt8(ascii: " "))  // the padding of a one-digit day
        guard let day = s.number(digits: 1...2), s.take(UInt8(ascii: " ")),
            let (hour, minute, second) = parseTime(&s), s.take(UInt8(ascii: " ")),
            let year = s.number(digits: 4...4), s.atEnd
        else { return nil }
        return Fields(
            year: year, month: month + 1, day: day, hour: hour, minute: minute, second: second)
    }

    /// `08:49:37`, two digits each.
    private static func parseTime(_ s: inout Scanner) -> (Int, Int, Int)? {
        guard let hour = s.number(digits: 2...2), s.take(UInt8(ascii: ":")),
            let minute = s.number(digits: 2...2), s.take(UInt8(ascii: ":")),
            let second = s.number(digits: 2...2)
        else { return nil }
        return (hour, minute, second)
    }

    /// The year a two-digit RFC 850 year stands for, seen from `currentYear`: the one with
    /// those last digits in the window of 100 years ending 50 years from now.
    static func fullYear(_ twoDigits: Int, currentYear: Int) -> Int {
        let century = currentYear - currentYear % 100
        var year = century + twoDigits
        if year > currentYear + 50 { year -= 100 }
        if year <= currentYear - 50 { year += 100 }
        return year
    }

    private static func currentYear() -> Int {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var time = now.tv_sec
        var parts = tm()
        guard gmtime_r(&time, &parts) != nil else { return 2000 }
        return Int(parts.tm_year) + 1900
    }

    /// Validates the ranges and converts with `timegm`.
    private static func epochSeconds(_ f: Fields) -> Double? {
        guard (1...12).contains(f.month), f.day >= 1, f.day <= daysIn(month: f.month, year: f.year),
            (0...23).contains(f.hour), (0...59).contains(f.minute), (0...60).contains(f.second)
        else { return nil }
        var parts = tm()
        parts.tm_year = Int32(f.year - 1900)
        parts.tm_mon = Int32(f.month - 1)
        parts.tm_mday = Int32(f.day)
        parts.tm_hour = Int32(f.hour)
        parts.tm_min = Int32(f.minute)
        parts.tm_sec = Int32(f.second)
        return Double(timegm(&parts))
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2:
            let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
            return leap ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// The index of `word` in `names`, compared case-insensitively (ASCII).
    private static func matches(_ word: ArraySlice<UInt8>, _ names: [String]) -> Int? {
        names.firstIndex { name in
            name.utf8.count == word.count
                && zip(name.utf8, word).allSatisfy { lowercased($0) == lowercased($1) }
        }
    }

    private static func lowercased(_ byte: UInt8) -> UInt8 {
        byte >= 65 && byte <= 90 ? byte + 32 : byte
    }

    private static func twoDigits(_ value: Int32) -> String {
        value < 10 ? "0\(value)" : "\(value)"
    }

    private static func fourDigits(_ value: Int) -> String {
        guard value >= 0 else { return "\(value)" }
        let digits = "\(value)"
        return String(repeating: "0", count: max(0, 4 - digits.utf8.count)) + digits
    }

    /// A cursor over the bytes of a date.
    struct Scanner {
        let bytes: [UInt8]
        var position = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { position == bytes.count }

        mutating func trimWhitespace() {
            var end = bytes.count
            while end > 0, bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09 { end -= 1 }
            var start = 0
            while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 { start += 1 }
            self = Scanner(Array(bytes[start..<end]))
        }

        func peek(at offset: Int) -> UInt8? {
            position + offset < bytes.count ? bytes[position + offset] : nil
        }

        mutating func take(_ byte: UInt8) -> Bool {
            guard position < bytes.count, bytes[position] == byte else { return false }
            position += 1
            return true
        }

        /// A run of ASCII letters (possibly empty).
        mutating func letters() -> ArraySlice<UInt8> {
            let start = position
            while position < bytes.count, (bytes[position] | 0x20) >= 97,
                (bytes[position] | 0x20) <= 122
            {
                position += 1
            }
            return bytes[start..<position]
        }

        /// `word` (case-sensitive), not followed by another letter.
        mutating func takeWord(_ word: String) -> Bool {
            let start = position
            let run = letters()
            if run.elementsEqual(word.utf8) { return true }
            position = start
            return false
        }

        /// A decimal number with a digit count in `digits`.
        mutating func number(digits: ClosedRange<Int>) -> Int? {
            let start = position
            var value = 0
            while position < bytes.count, position - start < digits.upperBound,
                bytes[position] >= 48, bytes[position] <= 57
            {
                value = value * 10 + Int(bytes[position] - 48)
                position += 1
            }
            let count = position - start
            // More digits than allowed is an error too, not a number followed by a digit.
            if position < bytes.count, bytes[position] >= 48, bytes[position] <= 57 { return nil }
            return digits.contains(count) ? value : nil
        }
    }
}
