// swift-tools-version:6.1
import PackageDescription

// Engine: pure Swift, no Foundation. The C ABI lives in FetchQCABI as thin
// `@c @implementation` shims checked by the compiler against include/fetchq.h.
let package = Package(
    name: "fetchq",
    products: [
        .library(name: "fetchq", type: .dynamic, targets: ["FetchQCABI"]),
        .library(name: "FetchQ", targets: ["FetchQ"]),
        // Installed as `fetchq` (the library product already has that name).
        .executable(name: "fetchq-cli", targets: ["fetchq-cli"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", exact: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", exact: "1.8.2"),
    ],
    targets: [
        .systemLibrary(
            name: "CJansson", path: "Sources/CJansson", pkgConfig: "jansson",
            providers: [.apt(["libjansson-dev"])]),
        .systemLibrary(
            name: "CCurl", path: "Sources/CCurl", pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(
            name: "CSQLite", path: "Sources/CSQLite", pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]),
        // The public header, include/fetchq.h (Sources/CFetchQ/include is a link to it).
        .target(name: "CFetchQ", dependencies: ["CJansson"], path: "Sources/CFetchQ"),
        // Internal C helpers: thread-locals and wrappers for curl's variadic calls.
        .target(name: "CFetchQSupport", dependencies: ["CCurl"], path: "Sources/CFetchQSupport"),
        .target(
            name: "FetchQ",
            dependencies: ["CJansson", "CCurl", "CSQLite", "CFetchQSupport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: [.swiftLanguageMode(.v6)]),
        .target(
            name: "FetchQCABI",
            dependencies: ["FetchQ", "CFetchQ", "CJansson", .product(name: "Logging", package: "swift-log")],
            swiftSettings: [.swiftLanguageMode(.v6)]),
        .executableTarget(
            name: "fetchq-cli",
            dependencies: ["FetchQ", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            path: "Sources/fetchq-cli", swiftSettings: [.swiftLanguageMode(.v6)]),
        .testTarget(
            name: "FetchQTests", dependencies: ["FetchQ", "CJansson", "CFetchQSupport"],
            swiftSettings: [.swiftLanguageMode(.v6)]),
    ]
)
