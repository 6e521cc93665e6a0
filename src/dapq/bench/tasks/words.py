"""Word lists for needle keys and for RULER's common-words task (RULER draws from wonderwords;
these are plain common English words chosen for this project, in the public domain)."""

ADJECTIVES = tuple("""
able ancient angry bold brave bright brisk busy calm careful cheerful clever cold cool crisp
curious damp dark deep dry dusty eager early easy empty fair faint fancy fast fierce fine
flat fresh friendly gentle giant glad golden grand great green happy hard heavy hidden hollow
honest huge humble icy idle jolly kind large late lazy light little lively lonely long loud
lucky mellow mighty misty modern narrow neat new nice noble odd old open pale plain plucky
polite proud quick quiet rapid rare rich rough round royal rustic sandy sharp shiny short
silent silly simple sleepy slow small smart smoky smooth soft solid spicy steep stormy
strange strong sunny swift tall tame tidy tiny vast vivid warm weary wet wide wild wise witty
young
""".split())

NOUNS = tuple("""
anchor apple arrow badger basket beacon beetle bell bicycle blanket boat bottle bridge brook
bucket button cabin camel candle canyon carpet castle cellar chimney cliff cloud comet copper
cottage crane crystal dolphin donkey dragon drum eagle engine falcon feather fence ferry field
flame flute forest fox garden gecko glacier goat harbor hammer harp hawk heron hill horizon
island jacket kettle kite ladder lantern lemon lion lizard lynx magnet maple meadow mirror
moose mountain needle oak ocean orchard otter owl paddle panda parrot pebble pencil pepper
piano pillow pine planet pond quarry rabbit raven ribbon river rocket saddle sail salmon
sparrow spider spoon squirrel statue stone storm sunset tiger tower trumpet tulip turtle
valley violin wagon walrus whale willow window wolf
""".split())

# Common words for CWE: frequent everyday nouns and verbs, disjoint from the key words above.
COMMON = tuple("""
ability account action activity address advice age agency air amount analysis animal answer
area army art article aspect attack attention audience author baby bank bar base bath bed
bird birth blood board body bone book border box boy brain branch bread breath brother
budget building business cake call camera campaign cancer capital car card care career
case cash cat cell chair chance change chapter charge chicken child choice church city
class client coast coffee college color company computer concept condition contract control
cook corner country county couple course court cousin cover cow crime culture cup customer
cycle damage dance data date daughter day deal death debate decision degree dentist design
desk detail device diamond diet dinner direction dirt disease doctor dog door dream dress
drink driver dust duty earth economy edge editor effect effort egg election employee energy
event evidence exam example exchange exercise expert eye face fact factor failure family
farm father fear film finger fish flight floor flower food foot force friend fruit fuel
future game gas gate gift girl glass goal gold government grass ground group growth guest
guide guitar hair hall hand hat head health heart height highway history hole holiday home
honey hook hospital hotel hour house housing idea image income industry insect instance
""".split())
