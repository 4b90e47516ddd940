import CJansson
import Testing

@testable import FetchQ

@Suite struct JSONSearchTests {
    func json(_ text: String) throws -> JSONRef {
        try JSONParser.parse(text, maxDepth: 16)
    }

    func pointer(_ text: String) throws -> JSONPointer {
        try JSONPointer(text)
    }

    /// The "n" field of each item, or "-" where the item has none.
    func names(_ array: JSONRef) -> [String] {
        array.elements.map { $0["n"]?.stringValue ?? "-" }
    }

    // MARK: extractArray

    @Test func extractArrayReturnsTheSameArray() throws {
        let doc = try json(#"{"data":{"items":[{"id":1},{"id":2}]}}"#)
        let items = try JSONSearch.extractArray(from: doc, at: pointer("/data/items"))
        #expect(items.dumps() == #"[{"id":1},{"id":2}]"#)
        #expect(items.pointer == json_object_get(json_object_get(doc.pointer, "data"), "items"))
        let whole = try json("[1,2]")
        #expect(try JSONSearch.extractArray(from: whole, at: .root).pointer == whole.pointer)
    }

    @Test func extractArrayErrorsNameThePointer() throws {
        let doc = try json(#"{"data":{"items":{"id":1}},"n":null}"#)
        let missing = #expect(throws: JSONSearchError.self) {
            try JSONSearch.extractArray(from: doc, at: pointer("/data/results"))
        }
        #expect(missing?.kind == .notFound)
        #expect(missing?.message == #"JSON pointer "/data/results" selects nothing in the response"#)
        let object = #expect(throws: JSONSearchError.self) {
            try JSONSearch.extractArray(from: doc, at: pointer("/data/items"))
        }
        #expect(object?.kind == .notArray)
        #expect(object?.message == #"JSON pointer "/data/items" selects an object, not an array"#)
        let null = #expect(throws: JSONSearchError.self) {
            try JSONSearch.extractArray(from: doc, at: pointer("/n"))
        }
        #expect(null?.message.contains("selects null") == true)
    }

    // MARK: sortItems

    @Test func numbersSortNumericallyAcrossIntegersAndReals() throws {
        let items = try json(
            #"[{"n":"a","k":10},{"n":"b","k":9.5},{"n":"c","k":-3},{"n":"d","k":100},"#
                + #"{"n":"e","k":9},{"n":"f","k":-3.5},{"n":"g","k":1e3}]"#)
        let up = try JSONSearch.sortItems(items, by: pointer("/k"))
        #expect(names(up) == ["f", "c", "e", "b", "a", "d", "g"])
        let down = try JSONSearch.sortItems(items, by: pointer("/k"), descending: true)
        #expect(names(down) == ["g", "d", "a", "b", "e", "c", "f"])
    }

    @Test func integerRealComparisonIsExactForLargeValues() throws {
        // 2^53 + 1 is not representable as a double: naive conversion would tie it with
        // 9007199254740992.0 and keep input order.
        let items = try json(
            #"[{"n":"big","k":9007199254740993},{"n":"real","k":9007199254740992.0},"#
                + #"{"n":"max","k":9223372036854775807},{"n":"huge","k":1e19}]"#)
        let up = try JSONSearch.sortItems(items, by: pointer("/k"))
        #expect(names(up) == ["real", "big", "max", "huge"])
    }

    @Test func stringsSortByUTF8BytesSoISODatesAreChronological() throws {
        let items = try json(
            #"[{"n":"a","d":"2024-03-01T10:00:00Z"},{"n":"b","d":"2023-12-31T23:59:59Z"},"#
                + #"{"n":"c","d":"2024-03-01T09:59:59Z"},{"n":"d","d":"2024-02-29T00:00:00Z"}]"#)
        let up = try JSONSearch.sortItems(items, by: pointer("/d"))
        #expect(names(up) == ["b", "d", "c", "a"])
        let text = try json(
            #"[{"n":"é","s":"é"},{"n":"z","s":"z"},{"n":"Z","s":"Z"},{"n":"ab","s":"ab"},"#
                + #"{"n":"a","s":"a"},{"n":"e","s":"e"}]"#)
        // Bytes: "Z" (5A) < "a" (61) < "ab" < "e" < "z" (7A) < "é" (C3 A9).
        #expect(names(try JSONSearch.sortItems(text, by: pointer("/s"))) == ["Z", "a", "ab", "e", "z", "é"])
    }

    @Test func booleansSortFalseFirst() throws {
        let items = try json(#"[{"n":"t1","b":true},{"n":"f1","b":false},{"n":"t2","b":true},{"n":"f2","b":false}]"#)
        #expect(names(try JSONSearch.sortItems(items, by: pointer("/b"))) == ["f1", "f2", "t1", "t2"])
        #expect(
            names(try JSONSearch.sortItems(items, by: pointer("/b"), descending: true))
                == ["t1", "t2", "f1", "f2"])
    }

    @Test func sortIsStableInBothDirections() throws {
        var text = "["
        for i in 0..<200 {
            if i > 0 { text += "," }
            text += #"{"n":"\#(i)","k":\#(i % 3)}"#
        }
        let items = try json(text + "]")
        let up = names(try JSONSearch.sortItems(items, by: pointer("/k")))
        let expectedUp = (0..<3).flatMap { k in (0..<200).filter { $0 % 3 == k }.map(String.init) }
        #expect(up == expectedUp)
        let down = names(try JSONSearch.sortItems(items, by: pointer("/k"), descending: true))
        let expectedDown = [2, 1, 0].flatMap { k in
            (0..<200).filter { $0 % 3 == k }.map(String.init)
        }
        #expect(down == expectedDown)
    }

    @Test func missingKeysGoLastInBothOrders() throws {
        let items = try json(
            #"[{"n":"m1"},{"n":"a","k":2},{"n":"m2","x":1},{"n":"b","k":1},"m3",{"n":"c","k":3}]"#)
        // "m3" is a string item: it has no "n", shown as "-".
        #expect(names(try JSONSearch.sortItems(items, by: pointer("/k"))) == ["b", "a", "c", "m1", "m2", "-"])
        #expect(
            names(try JSONSearch.sortItems(items, by: pointer("/k"), descending: true))
                == ["c", "a", "b", "m1", "m2", "-"])
    }

    @Test func mixedTypesFollowTheTypeRank() throws {
        let items = try json(
            #"[{"n":"obj","k":{}},{"n":"str","k":"a"},{"n":"num","k":5},{"n":"arr","k":[]},"#
                + #"{"n":"bool","k":true},{"n":"null","k":null},{"n":"missing"}]"#)
        #expect(
            names(try JSONSearch.sortItems(items, by: pointer("/k")))
                == ["null", "bool", "num", "str", "arr", "obj", "missing"])
        #expect(
            names(try JSONSearch.sortItems(items, by: pointer("/k"), descending: true))
                == ["obj", "arr", "str", "num", "bool", "null", "missing"])
    }

    @Test func nestedKeyPointers() throws {
        let items = try json(#"[{"n":"a","m":{"s":[3]}},{"n":"b","m":{"s":[1]}},{"n":"c","m":{"s":[2]}}]"#)
        #expect(names(try JSONSearch.sortItems(items, by: pointer("/m/s/0"))) == ["b", "c", "a"])
    }

    @Test func sortReferencesItemsAndLeavesTheInputAlone() throws {
        let items = try json(#"[{"n":"b","k":2},{"n":"a","k":1}]"#)
        let before = items.dumps()
        let first = try #require(json_array_get(items.pointer, 0))
        let sorted = try JSONSearch.sortItems(items, by: pointer("/k"))
        #expect(items.dumps() == before)
        #expect(sorted.pointer != items.pointer)
        #expect(json_array_get(sorted.pointer, 1) == first)  // same item, not a copy
        #expect(first.pointee.refcount == 2)  // held by both arrays
        #expect(sorted.pointer.pointee.refcount == 1)
        #expect(try JSONSearch.sortItems(json("[]"), by: pointer("/k")).dumps() == "[]")
        let notArray = #expect(throws: JSONSearchError.self) {
            try JSONSearch.sortItems(json("{}"), by: pointer("/k"))
        }
        #expect(notArray?.kind == .notArray)
    }

    // MARK: dedupe

    @Test func dedupeKeepsFirstOccurrenceAcrossArrays() throws {
        let a = try json(#"[{"id":1,"n":"a1"},{"id":2,"n":"a2"},{"id":1,"n":"a1again"}]"#)
        let b = try json(#"[{"id":2,"n":"b2"},{"id":3,"n":"b3"}]"#)
        let c = try json(#"[{"id":3,"n":"c3"},{"id":4,"n":"c4"}]"#)
        let merged = try JSONSearch.dedupe([a, b, c], idPointer: pointer("/id"))
        #expect(names(merged) == ["a1", "a2", "b3", "c4"])
        #expect(json_array_get(merged.pointer, 2) == json_array_get(b.pointer, 1))  // referenced
        let variadic = try JSONSearch.dedupe(b, a, idPointer: pointer("/id"))
        #expect(names(variadic) == ["b2", "b3", "a1"])
    }

    @Test func dedupeComparesIdsByCanonicalJSON() throws {
        let items = try json(
            #"[{"id":"1","n":"string1"},{"id":1,"n":"int1"},{"id":1.0,"n":"real1"},"#
                + #"{"id":1,"n":"int1dup"},{"id":"1","n":"string1dup"},{"id":1.0,"n":"real1dup"},"#
                + #"{"id":{"a":1,"b":2},"n":"obj"},{"id":{"b":2,"a":1},"n":"objdup"},"#
                + #"{"id":[1,2],"n":"arr"},{"id":[2,1],"n":"arr2"},{"id":null,"n":"null"},"#
                + #"{"id":null,"n":"nulldup"},{"id":true,"n":"true"},{"id":"true","n":"strtrue"}]"#)
        let merged = try JSONSearch.dedupe([items], idPointer: pointer("/id"))
        // A null id is no id (as for the item store): both null items stay.
        #expect(names(merged) == ["string1", "int1", "real1", "obj", "arr", "arr2", "null", "nulldup", "true", "strtrue"])
    }

    @Test func dedupeKeepsItemsWithoutIds() throws {
        let a = try json(#"[{"n":"x"},{"id":1,"n":"one"},{"n":"x"},"plain",{"id":1,"n":"dup"}]"#)
        let merged = try JSONSearch.dedupe([a, a], idPointer: pointer("/id"))
        #expect(merged.dumps() == #"[{"n":"x"},{"id":1,"n":"one"},{"n":"x"},"plain",{"n":"x"},{"n":"x"},"plain"]"#)
    }

    @Test func dedupeKeepsEveryItemWhoseIdIsNull() throws {
        let a = try json(#"[{"id":null,"n":1},{"id":null,"n":2},{"n":3},{"id":7,"n":4}]"#)
        let b = try json(#"[{"id":null,"n":5},{"id":7,"n":6}]"#)
        let merged = try JSONSearch.dedupe([a, b], idPointer: pointer("/id"))
        #expect(merged.elements.map { $0["n"]?.integerValue ?? -1 } == [1, 2, 3, 4, 5])
    }

    @Test func dedupeStringIdsWithUnicodeAndNul() throws {
        let a = try json(#"[{"id":"é","n":"1"},{"id":"e\u0301","n":"2"},{"id":"a\u0000","n":"3"},{"id":"a","n":"4"},{"id":"é","n":"5"}]"#)
        // Byte comparison: precomposed and decomposed é are different ids.
        #expect(names(try JSONSearch.dedupe([a], idPointer: pointer("/id"))) == ["1", "2", "3", "4"])
    }

    @Test func dedupeRejectsNonArrays() throws {
        let error = #expect(throws: JSONSearchError.self) {
            try JSONSearch.dedupe([json("[]"), json(#"{"a":1}"#)], idPointer: pointer("/id"))
        }
        #expect(error?.kind == .notArray)
        #expect(error?.message == "cannot merge input 1: an object, not an array")
        #expect(try JSONSearch.dedupe([], idPointer: pointer("/id")).dumps() == "[]")
    }

    @Test func mergeDedupeSortPipeline() throws {
        let page1 = try json(#"{"r":[{"id":"b","t":"2024-01-02"},{"id":"a","t":"2024-01-03"}]}"#)
        let page2 = try json(#"{"r":[{"id":"a","t":"1999-01-01"},{"id":"c","t":"2024-01-01"}]}"#)
        let results = try pointer("/r")
        var lists: [JSONRef] = []
        for page in [page1, page2] {
            lists.append(try JSONSearch.extractArray(from: page, at: results))
        }
        let merged = try JSONSearch.dedupe(lists, idPointer: pointer("/id"))
        let sorted = try JSONSearch.sortItems(merged, by: pointer("/t"), descending: true)
        #expect(sorted.elements.compactMap { $0["id"]?.stringValue } == ["a", "b", "c"])
    }
}

