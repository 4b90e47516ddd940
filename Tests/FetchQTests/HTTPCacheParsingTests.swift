import Testing

@testable import FetchQ

/// Cache-Control directives and HTTP-dates.
@Suite struct HTTPCacheParsingTests {
    private typealias D = CacheControl.Directive

    // MARK: - Cache-Control

    @Test func plainDirectives() {
        let cc = CacheControl("max-age=60, no-cache")
        #expect(cc.directives == [D(name: "max-age", value: "60"), D(name: "no-cache")])
        #expect(cc.maxAge == 60)
        #expect(cc.noCache)
        #expect(!cc.noStore)
        #expect(!cc.mustRevalidate)
    }

    @Test func quotedValuesOddSpacingAndCase() {
        let cc = CacheControl(
            #"  Max-Age = "120" ,, NO-CACHE="Set-Cookie, X-Foo" ,PRIVATE,\#t"#
                + #"ext="a\"b\\c" , must-revalidate,"#)
        #expect(
            cc.directives == [
                D(name: "max-age", value: "120"),
                D(name: "no-cache", value: "Set-Cookie, X-Foo"),
                D(name: "private"),
                D(name: "ext", value: #"a"b\c"#),
                D(name: "must-revalidate"),
            ])
        #expect(cc.maxAge == 120)
        #expect(cc.noCache)
        #expect(cc.isPrivate)
        #expect(!cc.isPublic)
        #expect(cc.mustRevalidate)
        #expect(cc.value("ext") == #"a"b\c"#)
    }

    @Test func emptyAndUnknownAndUnterminated() {
        #expect(CacheControl("").directives.isEmpty)
        #expect(CacheControl(" , ,, ").directives.isEmpty)
        #expect(CacheControl("=5, public").directives == [D(name: "public")])
        #expect(
            CacheControl(#"community="UCI", x=y z, public"#).directives == [
                D(name: "community", value: "UCI"), D(name: "x", value: "y"), D(name: "public"),
            ])
        #expect(
            CacheControl(#"ext="open, no-store"#).directives == [
                D(name: "ext", value: "open, no-store")
            ])
        #expect(!CacheControl(#"ext="open, no-store"#).noStore)
    }

    @Test func maxAgeValues() {
        #expect(CacheControl("public").maxAge == nil)
        #expect(CacheControl("max-age=0").maxAge == 0)
        #expect(CacheControl("max-age=abc").maxAge == 0)  // invalid: stale
        #expect(CacheControl("max-age=-5").maxAge == 0)
        #expect(CacheControl("max-age").maxAge == 0)
        #expect(CacheControl("max-age=99999999999999999999999").maxAge == 1 << 31)
        #expect(CacheControl("max-age=10, max-age=20").maxAge == 10)  // the first one
        #expect(CacheControl("s-maxage=10").maxAge == nil)
    }

    @Test func severalLinesAreOneList() {
        let cc = CacheControl(lines: ["private", "max-age=5, no-store"])
        #expect(cc.directives.map(\.name) == ["private", "max-age", "no-store"])
        #expect(cc.noStore)
        #expect(cc.maxAge == 5)
    }

    // MARK: - HTTP-date

    /// Sun, 06 Nov 1994 08:49:37 GMT.
    static let example = 784_111_777.0

    @Test func threeFormats() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") == Self.example)
        #expect(HTTPDate.parse("Sunday, 06-Nov-94 08:49:37 GMT") == Self.example)
        #expect(HTTPDate.parse("Sun Nov  6 08:49:37 1994") == Self.example)
        #expect(HTTPDate.parse("  Sun, 06 Nov 1994 08:49:37 GMT\t") == Self.example)
        #expect(HTTPDate.parse("sun, 06 nov 1994 08:49:37 GMT") == Self.example)
        #expect(HTTPDate.parse("Thu Nov 16 08:49:37 1994") == Self.example + 10 * 86_400)
        #expect(HTTPDate.parse("Thu, 01 Jan 1970 00:00:00 GMT") == 0)
        #expect(HTTPDate.parse("Fri, 31 Dec 9999 23:59:59 GMT") == 253_402_300_799)
    }

    @Test func leapDaysAndLeapSeconds() {
        #expect(HTTPDate.parse("Thu, 29 Feb 2024 12:00:00 GMT") == 1_709_208_000)
        #expect(HTTPDate.parse("Wed, 29 Feb 2023 12:00:00 GMT") == nil)
        #expect(HTTPDate.parse("Tue, 29 Feb 2000 00:00:00 GMT") == 951_782_400)
        #expect(HTTPDate.parse("Thu, 29 Feb 1900 00:00:00 GMT") == nil)
        // 23:59:60 is the next day's 00:00:00.
        #expect(
            HTTPDate.parse("Sat, 31 Dec 2016 23:59:60 GMT")
                == HTTPDate.parse("Sun, 01 Jan 2017 00:00:00 GMT"))
    }

    @Test func rfc850TwoDigitYears() {
        #expect(HTTPDate.fullYear(94, currentYear: 2025) == 1994)
        #expect(HTTPDate.fullYear(75, currentYear: 2025) == 2075)  // exactly 50 years ahead
        #expect(HTTPDate.fullYear(76, currentYear: 2025) == 1976)  // 51 years ahead: the past
        #expect(HTTPDate.fullYear(5, currentYear: 2025) == 2005)
        #expect(HTTPDate.fullYear(10, currentYear: 2080) == 2110)
        #expect(HTTPDate.fullYear(30, currentYear: 2080) == 2130)  // exactly 50 years ahead
        #expect(HTTPDate.fullYear(31, currentYear: 2080) == 2031)
        #expect(HTTPDate.fullYear(40, currentYear: 2080) == 2040)
    }

    @Test(arguments: [
        "", "0", "-1", "tomorrow",
        "Sun, 06 Nov 1994 08:49:37 PST",
        "Sun, 06 Nov 1994 08:49:37 gmt",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 06 Nov 1994 08:49:37 GMT extra",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 Nov 19945 08:49:37 GMT",
        "Sun, 006 Nov 1994 08:49:37 GMT",
        "Sun, 31 Nov 1994 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nox 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Fun, 06 Nov 1994 08:49:37 GMT",
        "Sun 06 Nov 1994 08:49:37 GMT",
        "Sun,06 Nov 1994 08:49:37 GMT",
        "Sun, 06-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sunday, 06 Nov 1994 08:49:37 GMT",
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 08:49:37 1994 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT,",
    ])
    func invalidDates(_ text: String) {
        #expect(HTTPDate.parse(text) == nil, "\(text)")
    }

    @Test func formatting() {
        #expect(HTTPDate.format(Self.example) == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(HTTPDate.format(Self.example + 0.999) == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(HTTPDate.format(0) == "Thu, 01 Jan 1970 00:00:00 GMT")
        #expect(HTTPDate.format(1_709_208_000) == "Thu, 29 Feb 2024 12:00:00 GMT")
        for seconds in stride(from: 0.0, to: 4_000_000_000, by: 123_456_789) {
            #expect(HTTPDate.parse(HTTPDate.format(seconds)) == seconds)
        }
    }
}
