WHO = "victim"
