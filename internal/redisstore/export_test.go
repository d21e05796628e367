package redisstore

// InfoField is infoField, for the package's external tests.
var InfoField = infoField
