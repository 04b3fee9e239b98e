; placement-logic proof obligation: composition/breaks-CR02
; theorem: Composition
; breaking CR02 reduce-where-varying is refuted
;   statement refuted: Gradients are reduced over exactly the axes where their contributions vary, once each.  [plan: dense gradients also all-reduced over the tensor axis y]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x0 (>= size_y 2)))
(or $x0)))
(check-sat)
(exit)
