import FuzzTargets

FuzzMain.run(name: "response", ResponseTarget.run)
